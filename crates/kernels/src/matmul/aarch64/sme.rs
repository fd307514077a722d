//! Arm SME kernels: the panel GEMM's integer outer products ([`panel_tile`]) and an f32 GEMM
//! on `FMOPA` ([`gemm_f32`]), each bit for bit its portable model in `matmul::gemm::tile`
//! (`panel_tile_model`, `gemm_f32_model`), and the start-up self-test that compares them.
//!
//! Each kernel is one `asm!` block that enters streaming mode with ZA enabled (`smstart`) and
//! leaves it (`smstop`) before it ends, so no Rust code runs in streaming mode. Entering and
//! leaving zeroes every Z and P register: each block names all of them (and `ffr`) as clobbered,
//! with the scalar registers it uses (`x12`: the ZA slice index, which must be one of w12–w15).
//! Timings under emulation (qemu) mean nothing; only the bits are checked there.
//!
//! # Safety
//! Every kernel here needs a CPU with [`Isa::Sme`](crate::simd::Isa::Sme)'s features (SME with
//! the int8 and f32 outer products, a streaming vector of at least 32 bytes).

use crate::matmul::gemm::panel::{PACKED_BLOCK, PANEL};
use crate::matmul::gemm::tile::{gemm_f32_model, panel_tile_model, TestData, TileJob, ROW_SCALARS};
use crate::simd::aarch64::sme_vector_bytes;
use std::arch::asm;

/// The panel GEMM's matrix-unit kernel (a `TileKernel`): `job.r` must be a quarter of the
/// streaming vector's bytes.
///
/// Per block: ZA tile 0 takes groups 0–3 and tile 1 groups 4–7 (`SUMOPA`: signed activation
/// bytes × unsigned panel codes, the codes predicated to their 32 bytes so columns 8.. stay
/// zero); then for each real row its two tile rows are read out (`MOVA`) and folded into its
/// 8 accumulators (8 active lanes): the offset term subtracted, converted (`SCVTF`), one fused
/// multiply-add by `d_w·d_x` per half (non-split: the halves added first) and for types with a
/// min one by `m_w·s_x`.
///
/// # Safety
/// SME as the module says; `job` as `TileJob` documents, `acc.len() ≥ job.rows ≥ 1`.
pub unsafe fn panel_tile(job: &TileJob, acc: &mut [[f32; PANEL]]) {
    let TileJob { act, sc, panel, nblk, r, rows, split, has_min } = *job;
    assert!(r * 4 == sme_vector_bytes() && rows >= 1 && rows <= r && acc.len() >= rows && nblk >= 1);
    assert!(act.len() >= nblk * 32 * r && sc.len() >= nblk * r * ROW_SCALARS && panel.len() >= nblk * PACKED_BLOCK);
    let flags = split as u64 | (has_min as u64) << 1;
    // SAFETY: SME present (the caller's contract); every load reads inside `act`, `sc` and
    // `panel` and every store inside `acc[..rows]` (checked above: a block reads 8 vectors of
    // `4r` bytes of `act`, `r · 16` bytes of `sc`, 320 bytes of `panel`; a row stores 8 f32).
    unsafe {
        asm!(
            ".arch_extension sme",
            "smstart",
            "ptrue p0.b",
            "mov {t}, #32",
            "whilelo p1.b, xzr, {t}",
            "mov {t}, #8",
            "whilelo p2.s, xzr, {t}",
            "ptrue p3.s",
            // Block loop.
            "2:",
            "zero {{za}}",
            // Groups 0-3 into tile 0, 4-7 into tile 1.
            "mov {t}, #4",
            "6:",
            "ld1b {{z0.b}}, p0/z, [{xa}]",
            "ld1b {{z1.b}}, p1/z, [{w}]",
            "sumopa za0.s, p0/m, p1/m, z0.b, z1.b",
            "addvl {xa}, {xa}, #1",
            "add {w}, {w}, #32",
            "subs {t}, {t}, #1",
            "b.ne 6b",
            "mov {t}, #4",
            "7:",
            "ld1b {{z0.b}}, p0/z, [{xa}]",
            "ld1b {{z1.b}}, p1/z, [{w}]",
            "sumopa za1.s, p0/m, p1/m, z0.b, z1.b",
            "addvl {xa}, {xa}, #1",
            "add {w}, {w}, #32",
            "subs {t}, {t}, #1",
            "b.ne 7b",
            // The panel's scales d_w (z16) and mins m_w (z17); {w} to the next block.
            "ld1w {{z16.s}}, p2/z, [{w}]",
            "add {t}, {w}, #32",
            "ld1w {{z17.s}}, p2/z, [{t}]",
            "add {w}, {w}, #64",
            // Row loop: w12 the tile row, {a} its accumulators, {s} its scalars.
            "mov w12, #0",
            "mov {a}, {acc}",
            "mov {s}, {sc}",
            "3:",
            "mova z2.s, p3/m, za0h.s[w12, 0]",
            "mova z3.s, p3/m, za1h.s[w12, 0]",
            "ld1rw {{z4.s}}, p3/z, [{s}]",
            "ld1rw {{z5.s}}, p3/z, [{s}, #4]",
            "ld1rw {{z6.s}}, p3/z, [{s}, #8]",
            "ld1rw {{z7.s}}, p3/z, [{s}, #12]",
            "ld1w {{z18.s}}, p2/z, [{a}]",
            "fmul z19.s, z16.s, z6.s",
            "tbnz {flags}, #0, 4f",
            "add z2.s, z2.s, z3.s",
            "sub z2.s, z2.s, z4.s",
            "scvtf z2.s, p3/m, z2.s",
            "fmla z18.s, p2/m, z2.s, z19.s",
            "tbz {flags}, #1, 5f",
            "fmla z18.s, p2/m, z17.s, z7.s",
            "b 5f",
            "4:",
            "sub z2.s, z2.s, z4.s",
            "scvtf z2.s, p3/m, z2.s",
            "fmla z18.s, p2/m, z2.s, z19.s",
            "sub z3.s, z3.s, z5.s",
            "scvtf z3.s, p3/m, z3.s",
            "fmul z20.s, z17.s, z6.s",
            "fmla z18.s, p2/m, z3.s, z20.s",
            "5:",
            "st1w {{z18.s}}, p2, [{a}]",
            "add {a}, {a}, #32",
            "add {s}, {s}, #16",
            "add w12, w12, #1",
            "cmp w12, {rows:w}",
            "b.lo 3b",
            "add {sc}, {sc}, {scstride}",
            "subs {n}, {n}, #1",
            "b.ne 2b",
            "smstop",
            xa = inout(reg) act.as_ptr() => _,
            w = inout(reg) panel.as_ptr() => _,
            sc = inout(reg) sc.as_ptr() => _,
            n = inout(reg) nblk => _,
            acc = in(reg) acc.as_mut_ptr(),
            rows = in(reg) rows,
            scstride = in(reg) r * ROW_SCALARS,
            flags = in(reg) flags,
            t = out(reg) _,
            a = out(reg) _,
            s = out(reg) _,
            out("x12") _,
            out("v0") _, out("v1") _, out("v2") _, out("v3") _, out("v4") _, out("v5") _, out("v6") _, out("v7") _,
            out("v8") _, out("v9") _, out("v10") _, out("v11") _, out("v12") _, out("v13") _, out("v14") _, out("v15") _,
            out("v16") _, out("v17") _, out("v18") _, out("v19") _, out("v20") _, out("v21") _, out("v22") _, out("v23") _,
            out("v24") _, out("v25") _, out("v26") _, out("v27") _, out("v28") _, out("v29") _, out("v30") _, out("v31") _,
            out("p0") _, out("p1") _, out("p2") _, out("p3") _, out("p4") _, out("p5") _, out("p6") _, out("p7") _,
            out("p8") _, out("p9") _, out("p10") _, out("p11") _, out("p12") _, out("p13") _, out("p14") _, out("p15") _,
            out("ffr") _,
            options(nostack),
        );
    }
}

/// One FMOPA tile step of [`gemm_f32`]: the `2r × 2r` block `c` (row-major, `2r` columns) gets
/// `k` outer products of `a` and `b` (each `k` vectors of `2r` f32: for every `kk`, rows'
/// values then columns' values), in the four ZA tiles (rows × columns halves).
///
/// # Safety
/// SME as the module says; `r` a quarter of the streaming vector's bytes, `k ≥ 1`,
/// `a.len(), b.len() ≥ 2r·k`, `c.len() ≥ 4r²`.
unsafe fn fmopa_block(a: &[f32], b: &[f32], c: &mut [f32], r: usize, k: usize) {
    assert!(r * 4 == sme_vector_bytes() && k >= 1 && a.len() >= 2 * r * k && b.len() >= 2 * r * k && c.len() >= 4 * r * r);
    // SAFETY: SME present (the caller's contract); loads read `2r·k` f32 of `a` and `b`; ZA
    // rows load from and store to `c`'s `2r` rows of `2r` f32 (checked above).
    unsafe {
        asm!(
            ".arch_extension sme",
            "smstart",
            "ptrue p0.s",
            // Load c: row i of the top half into za0 (columns 0..r) and za1 (r..2r), of the
            // bottom half into za2 and za3.
            "mov w12, #0",
            "mov {p}, {c}",
            "2:",
            "ld1w {{za0h.s[w12, 0]}}, p0/z, [{p}]",
            "ld1w {{za1h.s[w12, 0]}}, p0/z, [{p}, {r}, lsl #2]",
            "ld1w {{za2h.s[w12, 0]}}, p0/z, [{p}, {half}, lsl #2]",
            "add {q}, {p}, {half}, lsl #2",
            "ld1w {{za3h.s[w12, 0]}}, p0/z, [{q}, {r}, lsl #2]",
            "add {p}, {p}, {r}, lsl #3",
            "add w12, w12, #1",
            "cmp w12, {r:w}",
            "b.lo 2b",
            "3:",
            "ld1w {{z0.s}}, p0/z, [{a}]",
            "ld1w {{z1.s}}, p0/z, [{a}, #1, mul vl]",
            "ld1w {{z2.s}}, p0/z, [{b}]",
            "ld1w {{z3.s}}, p0/z, [{b}, #1, mul vl]",
            "fmopa za0.s, p0/m, p0/m, z0.s, z2.s",
            "fmopa za1.s, p0/m, p0/m, z0.s, z3.s",
            "fmopa za2.s, p0/m, p0/m, z1.s, z2.s",
            "fmopa za3.s, p0/m, p0/m, z1.s, z3.s",
            "addvl {a}, {a}, #2",
            "addvl {b}, {b}, #2",
            "subs {k}, {k}, #1",
            "b.ne 3b",
            "mov w12, #0",
            "mov {p}, {c}",
            "4:",
            "st1w {{za0h.s[w12, 0]}}, p0, [{p}]",
            "st1w {{za1h.s[w12, 0]}}, p0, [{p}, {r}, lsl #2]",
            "st1w {{za2h.s[w12, 0]}}, p0, [{p}, {half}, lsl #2]",
            "add {q}, {p}, {half}, lsl #2",
            "st1w {{za3h.s[w12, 0]}}, p0, [{q}, {r}, lsl #2]",
            "add {p}, {p}, {r}, lsl #3",
            "add w12, w12, #1",
            "cmp w12, {r:w}",
            "b.lo 4b",
            "smstop",
            a = inout(reg) a.as_ptr() => _,
            b = inout(reg) b.as_ptr() => _,
            k = inout(reg) k => _,
            c = in(reg) c.as_mut_ptr(),
            r = in(reg) r,
            // Elements from a top-half row to the bottom-half row of the same index: r rows of 2r.
            half = in(reg) 2 * r * r,
            p = out(reg) _,
            q = out(reg) _,
            out("x12") _,
            out("v0") _, out("v1") _, out("v2") _, out("v3") _, out("v4") _, out("v5") _, out("v6") _, out("v7") _,
            out("v8") _, out("v9") _, out("v10") _, out("v11") _, out("v12") _, out("v13") _, out("v14") _, out("v15") _,
            out("v16") _, out("v17") _, out("v18") _, out("v19") _, out("v20") _, out("v21") _, out("v22") _, out("v23") _,
            out("v24") _, out("v25") _, out("v26") _, out("v27") _, out("v28") _, out("v29") _, out("v30") _, out("v31") _,
            out("p0") _, out("p1") _, out("p2") _, out("p3") _, out("p4") _, out("p5") _, out("p6") _, out("p7") _,
            out("p8") _, out("p9") _, out("p10") _, out("p11") _, out("p12") _, out("p13") _, out("p14") _, out("p15") _,
            out("ffr") _,
            options(nostack),
        );
    }
}

/// `c += a · bᵀ` on FMOPA (`a`: `m × k`, `b`: `n × k`, `c`: `m × n`, row-major): the values of
/// `gemm_f32_model`, bit for bit. Blocks of `2r × 2r` outputs; `a`'s and `b`'s slices packed
/// per block (zero-padded at the edges), which allocates: for the profiler and the tests, not
/// a per-token path.
///
/// # Safety
/// SME as the module says.
pub unsafe fn gemm_f32(a: &[f32], b: &[f32], c: &mut [f32], m: usize, n: usize, k: usize) {
    assert!(a.len() >= m * k && b.len() >= n * k && c.len() >= m * n);
    if k == 0 {
        return;
    }
    let r = sme_vector_bytes() / 4;
    let t = 2 * r;
    let (mut pa, mut pb, mut blk) = (vec![0f32; t * k], vec![0f32; t * k], vec![0f32; t * t]);
    for i0 in (0..m).step_by(t) {
        let mi = (m - i0).min(t);
        pa.fill(0.0);
        for i in 0..mi {
            for kk in 0..k {
                pa[kk * t + i] = a[(i0 + i) * k + kk];
            }
        }
        for j0 in (0..n).step_by(t) {
            let nj = (n - j0).min(t);
            pb.fill(0.0);
            blk.fill(0.0);
            for j in 0..nj {
                for kk in 0..k {
                    pb[kk * t + j] = b[(j0 + j) * k + kk];
                }
            }
            for i in 0..mi {
                blk[i * t..i * t + nj].copy_from_slice(&c[(i0 + i) * n + j0..(i0 + i) * n + j0 + nj]);
            }
            // SAFETY: the caller's SME; sizes as `fmopa_block` asks.
            unsafe { fmopa_block(&pa, &pb, &mut blk, r, k) };
            for i in 0..mi {
                c[(i0 + i) * n + j0..(i0 + i) * n + j0 + nj].copy_from_slice(&blk[i * t..i * t + nj]);
            }
        }
    }
}

/// The start-up self-test: both kernels against their portable models on pseudo-random
/// operands with partial tiles (the int8 kernel on a split and an unsplit type with a min).
/// `true` when every bit agrees.
///
/// # Safety
/// SME as the module says.
pub unsafe fn self_test() -> bool {
    let r = sme_vector_bytes() / 4;
    let mut d = TestData::default();
    // f32: a partial tile in both directions, k = 37.
    let (m, n, k) = (2 * r + 3, r + 5, 37);
    let a: Vec<f32> = (0..m * k).map(|_| d.unit()).collect();
    let b: Vec<f32> = (0..n * k).map(|_| d.unit()).collect();
    let c0: Vec<f32> = (0..m * n).map(|_| d.unit()).collect();
    let (mut c, mut want) = (c0.clone(), c0);
    // SAFETY: the caller's SME.
    unsafe { gemm_f32(&a, &b, &mut c, m, n, k) };
    gemm_f32_model(&a, &b, &mut want, m, n, k);
    let f32_ok = c.iter().zip(&want).all(|(x, y)| x.to_bits() == y.to_bits());
    // int8 panel: 3 blocks, r − 1 real rows, codes up to 255, both float paths.
    let nblk = 3;
    let act: Vec<i8> = (0..nblk * 32 * r).map(|_| d.word() as i8).collect();
    let sc = d.scalars(nblk * r);
    let panel = d.panel(nblk);
    let mut int_ok = true;
    for (split, has_min) in [(false, true), (true, false)] {
        let job = TileJob { act: &act, sc: &sc, panel: &panel, nblk, r, rows: r - 1, split, has_min };
        let start: Vec<[f32; PANEL]> = (0..r).map(|_| std::array::from_fn(|_| d.unit())).collect();
        let (mut got, mut want) = (start.clone(), start);
        // SAFETY: the caller's SME; the job's buffers are sized as `TileJob` says.
        unsafe { panel_tile(&job, &mut got) };
        panel_tile_model(&job, &mut want);
        int_ok &= got.iter().flatten().zip(want.iter().flatten()).all(|(x, y)| x.to_bits() == y.to_bits());
    }
    f32_ok && int_ok
}
