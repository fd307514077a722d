//! The x86 panel kernels against their portable twin at the edges the parity suite does not
//! reach: the AVX2 sums at extreme codes, every AVX2 form (`maddubs`, AVX-VNNI; one panel and
//! two) whichever `gemm` picks, and the SIMD decoders' bytes.
use super::*;

/// `n` random bytes (xorshift from `seed`), with every f16 a finite value of either sign
/// (whatever the block layout puts at even offsets, its scales are among them).
fn random_rows(seed: &mut u64, n: usize) -> Vec<u8> {
    let mut w: Vec<u8> = (0..n)
        .map(|_| {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            *seed as u8
        })
        .collect();
    for v in w.chunks_exact_mut(2) {
        if v[1] & 0x7C == 0x7C {
            v[1] &= !0x40;
        }
    }
    w
}

/// [`random_rows`] of a `t` matrix: MXFP4's E8M0 exponents (its blocks' first bytes, at odd
/// offsets too) kept within 2^±8, where random ones reach 2^127 and the sums overflow.
fn random_matrix(t: DType, seed: &mut u64, n: usize) -> Vec<u8> {
    let mut w = random_rows(seed, n);
    if t == DType::MXFP4 {
        for b in w.chunks_exact_mut(std::mem::size_of::<BlockMXFP4>()) {
            b[0] = 120 + b[0] % 16;
        }
    }
    w
}

/// A portable activation quantizer: values in, one row of blocks out.
type Quantize = fn(&[f32], &mut [u8]);

/// The activation type of kind `act` and its portable quantizer.
fn act_quantizer(act: Act) -> (DType, Quantize) {
    use crate::quant::portable::{quant_q8_0, quant_q8_1, quant_q8_k};
    match act {
        Act::Q8_0 => (DType::Q8_0, quant_q8_0),
        Act::Q8_1 => (DType::Q8_1, quant_q8_1),
        Act::Q8K => (DType::Q8K, quant_q8_k),
    }
}

/// The AVX2 panel kernel at the codes and activations that make its i16 sums largest:
/// every code at the type's largest (Q8_0 also at its smallest signed byte, −128) against
/// rows of ±127 (Q8_K: −128), every register tile height. A `maddubs` pair or an i16 sum of
/// `G` of them that saturated would differ from the portable twin's exact integers.
#[test]
fn avx2_panel_sums_stay_exact_at_extreme_codes() {
    if !Isa::Avx2.missing().is_empty() {
        return;
    }
    for t in [DType::Q4_0, DType::Q5_0, DType::Q8_0, DType::MXFP4, DType::Q4_1, DType::Q5_1, DType::Q4K, DType::Q5K, DType::Q6K] {
        let (act, o, split) = (act_of(t), offset(t), split16(t));
        let k = 256;
        let nb = k / 32;
        let (vdt, quantize) = act_quantizer(act);
        let xrb = crate::row_bytes(vdt, k);
        // Rows of +1 and of −1: every value at the quantizer's extreme, of one sign.
        let rows = 8;
        let mut x = vec![0u8; rows * xrb];
        for r in 0..rows {
            let v = if r % 2 == 0 { 1.0 } else { -1.0 };
            quantize(&vec![v; k], &mut x[r * xrb..(r + 1) * xrb]);
        }
        let mut ysum = vec![0i32; rows * nb * 2];
        block_sums(&x, xrb, rows, nb, act, &mut ysum);
        let codes: &[u8] = if t == DType::Q8_0 { &[255, 0] } else { &[umax(t) as u8] };
        for &u in codes {
            let mut panel = vec![0u8; nb * PACKED_BLOCK];
            for blk in panel.chunks_exact_mut(PACKED_BLOCK) {
                blk[..256].fill(u);
                for col in 0..PANEL {
                    blk[256 + 4 * col..260 + 4 * col].copy_from_slice(&(1.0f32 + col as f32).to_le_bytes());
                    blk[288 + 4 * col..292 + 4 * col].copy_from_slice(&(0.5f32).to_le_bytes());
                }
            }
            for mr in crate::matmul::schedule::PANEL_MR {
                let job = PanelJob { panel: &panel, nb, b0: 0, b1: nb, mr, o, umax: umax(t), act, split, x: &x, xrb, ysum: &ysum, sc: &[], sc_rows: 0, rows, ahead: &[] };
                let (mut p, mut s) = (vec![[0f32; PANEL]; rows], vec![[f32::NAN; PANEL]; rows]);
                panel_portable(job, |_| [0.0; PANEL], |r, a| p[r] = *a);
                // SAFETY: AVX2 (with FMA and F16C, the table's features) detected above.
                unsafe { x86::panel_avx2(job, |_| [0.0; PANEL], |r, a| s[r] = *a) };
                assert!(p.iter().flatten().zip(s.iter().flatten()).all(|(a, b)| a.to_bits() == b.to_bits()), "{t}: codes {u}, mr {mr}: {:?} vs portable {:?}", s[0], p[0]);
            }
        }
    }
}

/// The AVX2 table's panel kernels — `maddubs`, and AVX-VNNI's `vpdpbusd` where the CPU has
/// it; one panel and two per pass — bit-identical to the portable twin on random weights
/// and rows, with the block scalars converted once per call (as `gemm_impl` runs them) and
/// read from the rows, at every register tile height and a ragged row count. (The parity
/// suite reaches only the form `simd::x86::avx_vnni` picks through `gemm`.)
#[test]
fn avx2_panel_kernels_equal_portable() {
    if !Isa::Avx2.missing().is_empty() {
        return;
    }
    let vnni = is_x86_feature_detected!("avxvnni");
    let mut seed = 0x1234_5678_9ABC_DEF1u64;
    for t in [DType::Q4_0, DType::Q5_0, DType::Q8_0, DType::MXFP4, DType::Q4_1, DType::Q5_1, DType::Q4K, DType::Q5K, DType::Q6K] {
        let (act, o, split) = (act_of(t), offset(t), split16(t));
        let k = 512;
        let nb = k / 32;
        let w = random_matrix(t, &mut seed, 16 * crate::row_bytes(t, k));
        let (mut p0, mut p1) = (vec![0u8; nb * PACKED_BLOCK], vec![0u8; nb * PACKED_BLOCK]);
        pack(t, &w, k, 0, PANEL, &mut p0);
        pack(t, &w, k, PANEL, PANEL, &mut p1);
        let (vdt, quantize) = act_quantizer(act);
        let (rows, xrb) = (11, crate::row_bytes(vdt, k));
        let mut x = vec![0u8; rows * xrb];
        for r in 0..rows {
            let xf: Vec<f32> = random_rows(&mut seed, k).iter().map(|&b| (b as f32 - 127.5) / 32.0).collect();
            quantize(&xf, &mut x[r * xrb..(r + 1) * xrb]);
        }
        let mut ysum = vec![0i32; rows * nb * 2];
        block_sums(&x, xrb, rows, nb, act, &mut ysum);
        // As `gemm_impl` makes them for the x86 kernels: the offsets' terms negated.
        let mut sc = vec![0u8; nb * rows * ROW_SCALARS];
        // SAFETY: AVX2 and F16C (the table's features) detected above.
        unsafe { x86::row_scalars(&x, xrb, rows, nb, act, &ysum, (-o, split), &mut sc) };
        for mr in crate::matmul::schedule::PANEL_MR {
            let job = |panel, with_sc: bool| PanelJob { panel, nb, b0: 0, b1: nb, mr, o, umax: umax(t), act, split, x: &x, xrb, ysum: &ysum, sc: if with_sc { &sc } else { &[] }, sc_rows: rows, rows, ahead: &[] };
            let mut want = [vec![[0f32; PANEL]; rows], vec![[0f32; PANEL]; rows]];
            for (p, panel) in [&p0, &p1].into_iter().enumerate() {
                panel_portable(job(panel, false), |_| [0.5; PANEL], |r, a| want[p][r] = *a);
            }
            for (vn, with_sc) in [(false, false), (false, true), (true, false), (true, true)] {
                if vn && !vnni {
                    continue;
                }
                let (mut one, mut two) = (vec![[f32::NAN; PANEL]; rows], [vec![[f32::NAN; PANEL]; rows], vec![[f32::NAN; PANEL]; rows]]);
                // SAFETY: AVX2, FMA and F16C detected above, AVX-VNNI where `vn`.
                unsafe {
                    if vn {
                        x86::panel_avx_vnni(job(&p0, with_sc), |_| [0.5; PANEL], |r, a| one[r] = *a);
                        x86::panel_pair_avx_vnni(job(&p0, with_sc), &p1, |_, _| [0.5; PANEL], |r, p, a| two[p][r] = *a);
                    } else {
                        x86::panel_avx2(job(&p0, with_sc), |_| [0.5; PANEL], |r, a| one[r] = *a);
                        x86::panel_pair_avx2(job(&p0, with_sc), &p1, |_, _| [0.5; PANEL], |r, p, a| two[p][r] = *a);
                    }
                }
                let same = |a: &[[f32; PANEL]], b: &[[f32; PANEL]]| a.iter().flatten().zip(b.iter().flatten()).all(|(a, b)| a.to_bits() == b.to_bits());
                let what = format!("{t}, mr {mr}, AVX-VNNI {vn}, block scalars once {with_sc}");
                assert!(same(&one, &want[0]), "{what}: one panel {:?} vs portable {:?}", one[0], want[0][0]);
                assert!(same(&two[0], &want[0]) && same(&two[1], &want[1]), "{what}: two panels {:?} vs portable {:?}", two[1][0], want[1][0]);
            }
        }
    }
}

/// The AVX2 decoder writes the scalar decoder's bytes for every type, every column count
/// of a panel (the missing columns padded) and rows of several blocks and super-blocks —
/// alone, and as either half of a pair (`PanelLayout::pair`: the two panels' 32-byte units
/// alternating).
#[test]
fn simd_pack_equals_scalar_pack() {
    if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c")) {
        return;
    }
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    for t in [DType::Q4_0, DType::Q5_0, DType::Q8_0, DType::MXFP4, DType::Q4_1, DType::Q5_1, DType::Q4K, DType::Q5K, DType::Q6K] {
        let k = if t.block_size() == 256 { 512 } else { 96 };
        let w = random_matrix(t, &mut seed, 10 * crate::row_bytes(t, k));
        for n in 1..=PANEL {
            let (mut a, mut b) = (vec![0u8; k / 32 * PACKED_BLOCK], vec![1u8; k / 32 * PACKED_BLOCK]);
            pack(t, &w, k, 10 - n, n, &mut a);
            // SAFETY: AVX2 and F16C detected above.
            unsafe { x86::pack(t, &w, k, 10 - n, n, offset(t), &mut b, PanelLayout::SINGLE) };
            assert!(a == b, "{t}: {n} columns");
            for h in 0..2 {
                let mut pair = vec![1u8; 2 * a.len()];
                // SAFETY: as above.
                unsafe { x86::pack(t, &w, k, 10 - n, n, offset(t), &mut pair, PanelLayout::pair(h)) };
                assert_eq!(half_of(&pair, h), a, "{t}: {n} columns, half {h} of a pair");
            }
        }
    }
}

/// The AVX-512 and AVX2 decoders of interleaved groups write the plain rows' panels, byte
/// for byte, for each type they take, at every group of a matrix, with one group or two per
/// panel.
#[test]
fn group_pack_equals_row_pack() {
    let (wide, avx2) = (Isa::Avx512.missing().is_empty(), Isa::Avx2.missing().is_empty());
    let mut seed = 0x2545_F491_4F6C_DD1Du64;
    // The AVX-512 table's layout (Q5's fifth bits as masks), which AVX2's packer does not read.
    let layout = crate::matmul::layout::Layout { q5: crate::matmul::layout::Q5Bits::Masks, q6: crate::matmul::layout::Q6Form::Split };
    for t in [DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q4K, DType::Q6K] {
        let k = if t.block_size() == 256 { 512 } else { 160 };
        let rb = crate::row_bytes(t, k);
        let w = random_rows(&mut seed, 20 * rb);
        let mut g = vec![0u8; w.len()];
        layout.pack(t, &w, rb, &mut g);
        // The AVX2 table's layout (Q5's fifth bits folded into the values, Q6_K's values
        // folded), which its packer reads.
        let mut g2 = vec![0u8; w.len()];
        crate::matmul::layout::Layout { q5: crate::matmul::layout::Q5Bits::Folded, q6: crate::matmul::layout::Q6Form::Folded }.pack(t, &w, rb, &mut g2);
        for (c0, n) in [(0, 8), (4, 8), (0, 4), (4, 4), (8, 4)] {
            let mut a = vec![0u8; k / 32 * PACKED_BLOCK];
            pack(t, &w, k, c0, n, &mut a);
            if wide && packs_groups(t, Isa::Avx512) {
                let mut b = vec![1u8; a.len()];
                // SAFETY: AVX-512 detected above.
                unsafe { groups::pack_groups(t, &g, k, c0, n, &mut b, PanelLayout::SINGLE) };
                assert!(a == b, "{t}: columns {c0}.. ({n})");
                for h in 0..2 {
                    let mut pair = vec![1u8; 2 * a.len()];
                    // SAFETY: AVX-512 detected above.
                    unsafe { groups::pack_groups(t, &g, k, c0, n, &mut pair, PanelLayout::pair(h)) };
                    assert_eq!(half_of(&pair, h), a, "{t}: columns {c0}.. ({n}), half {h} of a pair");
                }
            }
            if avx2 && packs_groups(t, Isa::Avx2) {
                let mut b = vec![1u8; a.len()];
                // SAFETY: AVX2 (and F16C, part of the table's features) detected above.
                unsafe { groups::pack_groups_avx2(t, &g2, k, c0, n, &mut b) };
                assert!(a == b, "{t} (AVX2): columns {c0}.. ({n})");
            }
        }
        // A whole pair in one pass: each half the panel of its eight columns packed alone.
        if wide && packs_groups(t, Isa::Avx512) {
            for c0 in [0, 4] {
                let mut pair = vec![1u8; 2 * k / 32 * PACKED_BLOCK];
                // SAFETY: AVX-512 detected above.
                unsafe { groups::pack_groups_pair(t, &g, k, c0, &mut pair) };
                for h in 0..2 {
                    let mut a = vec![0u8; k / 32 * PACKED_BLOCK];
                    pack(t, &w, k, c0 + h * PANEL, PANEL, &mut a);
                    assert_eq!(half_of(&pair, h), a, "{t}: columns {c0}.. packed as a pair in one pass, half {h}");
                }
            }
        }
    }
}

/// Half `h` of panels packed as a pair (`PanelLayout::pair`), as one panel packed alone: every
/// other 32-byte unit, from the `h`th.
fn half_of(pair: &[u8], h: usize) -> Vec<u8> {
    pair.chunks_exact(32).skip(h).step_by(2).flatten().copied().collect()
}
