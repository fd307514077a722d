//! Weights interleaved at load (`corelm_kernels::interleave`): the layout round-trips, and its
//! SIMD GEMV and tiles equal the plain rows' `vec_dot` bit for bit, the portable twin, and an
//! f32 reference. Random rows; several row lengths and row counts.

use corelm_kernels::matmul::layout::{self as interleave, scratch_len, Layout, Q5Bits, Q6Form};
use corelm_kernels::{row_bytes, DType, Kernels};

mod common;
use common::{aligned, random_row, Rng};

const TYPES: [DType; 9] = [DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q4K, DType::Q6K, DType::IQ4NL, DType::IQ4XS];

/// `n_rows` random rows of `k` values of `t`, contiguous.
fn matrix(t: DType, k: usize, n_rows: usize, rng: &mut Rng) -> Vec<u8> {
    aligned((0..n_rows).flat_map(|_| random_row(t, k, rng)).collect())
}

fn activations(k: &Kernels, t: DType, n: usize, rng: &mut Rng) -> (Vec<f32>, Vec<u8>) {
    let vdt = k.ops(t).unwrap().vec_dot_type;
    let x: Vec<f32> = (0..n).map(|_| rng.f32()).collect();
    let mut q = aligned(vec![0u8; row_bytes(vdt, n)]);
    k.from_float(vdt).unwrap()(&x, &mut q);
    (x, q)
}

#[test]
fn pack_then_unpack_is_the_identity() {
    let mut rng = Rng(0x51ED_2701);
    let forms = [Layout { q5: Q5Bits::Masks, q6: Q6Form::Split }, Layout { q5: Q5Bits::Folded, q6: Q6Form::Folded }];
    for t in TYPES {
        for (k, n_rows) in [(32, 4), (96, 8), (320, 12)] {
            let k = if t.block_size() == 256 { 8 * k } else { k };
            // Any bytes at all, not only well-formed blocks: the layout moves bits, it reads none.
            let x: Vec<u8> = (0..row_bytes(t, k) * n_rows).map(|_| rng.next() as u8).collect();
            let xrb = row_bytes(t, k);
            let mut packed = Vec::new();
            for layout in forms {
                let (mut g, mut back) = (vec![0u8; x.len()], vec![0u8; x.len()]);
                layout.pack(t, &x, xrb, &mut g);
                assert_ne!(g, x, "{t}: packing moved nothing");
                layout.unpack(t, &g, xrb, &mut back);
                assert_eq!(back, x, "{t} {layout:?} k={k} rows={n_rows}");
                packed.push(g);
            }
            // The forms differ in the Q5 types' and Q6_K's bytes only.
            assert_eq!(packed[0] == packed[1], !matches!(t, DType::Q5_0 | DType::Q5_1 | DType::Q6K), "{t}");
        }
    }
    assert!(!interleave::supported(DType::Q5K));
}

#[test]
fn interleaved_gemv_and_tiles_equal_plain_row_dots() {
    let tables = common::tables();
    // Every SIMD table this CPU runs has them (x86 and aarch64; the portable one repacks
    // nothing).
    for k in tables.iter().filter(|k| k.isa() != corelm_kernels::Isa::Portable) {
        assert!(TYPES.iter().all(|&t| k.ops(t).unwrap().interleaved.is_some()), "{}: a type without interleaved kernels", k.isa());
    }
    // The AVX2 table decodes Q5 and Q6_K column blocks once for all of a batch's rows.
    if let Some(avx2) = tables.iter().find(|k| k.isa() == corelm_kernels::Isa::Avx2) {
        for t in [DType::Q5_0, DType::Q5_1, DType::Q6K] {
            assert!(avx2.ops(t).unwrap().interleaved.unwrap().tiles.decoded.is_some(), "avx2 {t}: no decoded tiles");
        }
        // ... and has tiles of two and three rows for every type but Q4_K.
        for &t in TYPES.iter().filter(|&&t| t != DType::Q4K) {
            assert!(avx2.ops(t).unwrap().interleaved.unwrap().tiles.few.is_some(), "avx2 {t}: no tiles of two and three rows");
        }
    }
    // The AVX-512 table decodes the types stored with an offset (signed values, their lane sums)
    // and Q6_K (its 6-bit values).
    if let Some(avx512) = tables.iter().find(|k| k.isa() == corelm_kernels::Isa::Avx512) {
        for t in [DType::Q4_0, DType::Q5_0, DType::Q8_0, DType::IQ4NL, DType::Q6K] {
            assert!(avx512.ops(t).unwrap().interleaved.unwrap().tiles.decoded.is_some(), "avx512 {t}: no decoded tiles");
        }
        // ... and has tiles of two and three rows for every type but Q4_K (four-row quads).
        for &t in TYPES.iter().filter(|&&t| t != DType::Q4K) {
            assert!(avx512.ops(t).unwrap().interleaved.unwrap().tiles.few.is_some(), "avx512 {t}: no tiles of two and three rows");
        }
    }
    for fast in &tables {
        interleaved_equal_plain(fast);
    }
}

fn interleaved_equal_plain(fast: &Kernels) {
    let port = Kernels::portable();
    let mut rng = Rng(0x1234_5678_9ABC);
    for t in TYPES {
        let Some(il) = fast.ops(t).unwrap().interleaved else {
            continue;
        };
        let isa = fast.isa();
        let vec_dot = fast.ops(t).unwrap().vec_dot;
        for (k, n_rows) in [(32, 4), (64, 8), (576, 16), (896, 12), (4864, 4)] {
            // Q4_K: 256-value blocks (896 = 3.5 blocks does not exist; 1024 stands in).
            let k = if t.block_size() == 256 { (k * 8).clamp(256, 4864) / 256 * 256 } else { k };
            let xrb = row_bytes(t, k);
            let w = matrix(t, k, n_rows, &mut rng);
            let mut g = aligned(vec![0u8; w.len()]);
            fast.layout().pack(t, &w, xrb, &mut g);
            let mut prep = vec![0i32; scratch_len(k)];
            let acts: Vec<(Vec<f32>, Vec<u8>)> = (0..4).map(|_| activations(fast, t, k, &mut rng)).collect();
            // GEMV, against the plain SIMD dot, the portable twin and the f32 reference.
            let (x, y) = &acts[0];
            let mut out = vec![0f32; n_rows];
            (il.rows)(&g, xrb, y, &mut out, &mut prep);
            let mut twin = vec![0f32; n_rows];
            let mut row = aligned(vec![0u8; 4 * xrb]);
            fast.layout().rows_portable(t, port.ops(t).unwrap().vec_dot, &g, xrb, y, &mut twin, &mut row);
            let mut wf = vec![0f32; k];
            for c in 0..n_rows {
                let plain = &w[c * xrb..(c + 1) * xrb];
                assert_eq!(out[c].to_bits(), vec_dot(plain, y).to_bits(), "{isa:?} {t} k={k} row {c}: GEMV {} vs vec_dot {}", out[c], vec_dot(plain, y));
                assert!((out[c] - twin[c]).abs() <= 1e-4 * (1.0 + twin[c].abs()), "{t} k={k} row {c}: {} vs portable {}", out[c], twin[c]);
                (port.ops(t).unwrap().to_float)(plain, &mut wf);
                let r: f64 = wf.iter().zip(x).map(|(&a, &b)| a as f64 * b as f64).sum();
                let mag: f64 = wf.iter().map(|v| v.abs() as f64).sum();
                assert!((out[c] as f64 - r).abs() <= 0.01 * mag + 1e-3, "{t} k={k} row {c}: {} vs f32 {r}", out[c]);
            }
            let tiles = il.tiles;
            // Tiles give the tile dot's values (Q4_K: ggml's repacked order; the others: vec_dot).
            let vec_dot = fast.ops(t).unwrap().vec_dot_tile;
            // Tiles: four activation rows at once.
            let ys = [&acts[0].1[..], &acts[1].1[..], &acts[2].1[..], &acts[3].1[..]];
            let mut tile = vec![[0f32; 4]; n_rows];
            (tiles.tile)(&g, xrb, ys, &mut tile, &mut prep);
            for (c, o) in tile.iter().enumerate() {
                for (j, y) in ys.iter().enumerate() {
                    let want = vec_dot(&w[c * xrb..(c + 1) * xrb], y);
                    assert_eq!(o[j].to_bits(), want.to_bits(), "{isa:?} {t} k={k} row {c} act {j}: tile {} vs vec_dot_tile {want}", o[j]);
                }
            }
            // Two and three activation rows (a short batch), where the table has them.
            if let Some(few) = tiles.few {
                let mut two = vec![[0f32; 2]; n_rows];
                (few.tile2)(&g, xrb, [ys[0], ys[1]], &mut two, &mut prep);
                let mut three = vec![[0f32; 3]; n_rows];
                (few.tile3)(&g, xrb, [ys[0], ys[1], ys[2]], &mut three, &mut prep);
                for c in 0..n_rows {
                    for (j, y) in ys.iter().enumerate().take(3) {
                        let want = vec_dot(&w[c * xrb..(c + 1) * xrb], y).to_bits();
                        assert!((j == 2 || two[c][j].to_bits() == want) && three[c][j].to_bits() == want, "{isa:?} {t} k={k} row {c} act {j}: tile2/3 vs vec_dot_tile");
                    }
                }
            }
            // Eight activation rows at once (the four above and four more).
            let more: Vec<(Vec<f32>, Vec<u8>)> = (0..4).map(|_| activations(fast, t, k, &mut rng)).collect();
            let ys8: [&[u8]; 8] = std::array::from_fn(|j| if j < 4 { ys[j] } else { &more[j - 4].1[..] });
            let mut tile = vec![[0f32; 8]; n_rows];
            (tiles.tile8)(&g, xrb, ys8, &mut tile, &mut prep);
            for (c, o) in tile.iter().enumerate() {
                for (j, y) in ys8.iter().enumerate() {
                    let want = vec_dot(&w[c * xrb..(c + 1) * xrb], y);
                    assert_eq!(o[j].to_bits(), want.to_bits(), "{isa:?} {t} k={k} row {c} act {j}: tile8 {} vs vec_dot_tile {want}", o[j]);
                }
            }
            // The same eight rows on the groups decoded once (where the table has that form);
            // the buffer is dirtied first so that a value not written by `decode` shows.
            if let Some(d) = tiles.decoded {
                let mut dec = vec![0xA5u8; d.len(n_rows, k)];
                (d.decode)(&g, xrb, &mut dec);
                let mut tile = vec![[0f32; 8]; n_rows];
                (d.tile8)(&g, &dec, xrb, ys8, &mut tile, &mut prep);
                for (c, o) in tile.iter().enumerate() {
                    for (j, y) in ys8.iter().enumerate() {
                        let want = vec_dot(&w[c * xrb..(c + 1) * xrb], y);
                        assert_eq!(o[j].to_bits(), want.to_bits(), "{isa:?} {t} k={k} row {c} act {j}: decoded tile8 {} vs vec_dot_tile {want}", o[j]);
                    }
                }
            }
        }
    }
}
