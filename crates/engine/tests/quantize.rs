//! `corelm quantize` end to end: the file it writes parses, carries the metadata, holds ggml's
//! own bytes for every type (fixtures/quants.gguf has ggml_quantize_chunk's output for the
//! same input), and a quantized model still computes what the F16 one does, within each
//! type's error. Also a model split in files as `gguf-split` writes them.

mod common;

use corelm_engine::quantize::quantize_file;
use corelm_engine::{Engine, EngineConfig};
use corelm_gguf::Gguf;
use corelm_kernels::DType;
use std::path::PathBuf;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

/// A file in the temporary directory, this process's own (each test removes its files; no
/// directory is left behind).
fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("corelm-quantize-{}-{name}", std::process::id()))
}

#[test]
fn written_bytes_equal_ggml_quantizer() {
    let src = fixtures().join("quants.gguf");
    for (name, t) in [
        ("Q4_0", DType::Q4_0),
        ("Q4_1", DType::Q4_1),
        ("Q5_0", DType::Q5_0),
        ("Q5_1", DType::Q5_1),
        ("Q8_0", DType::Q8_0),
        ("Q4_K", DType::Q4K),
        ("Q6_K", DType::Q6K),
        ("IQ4_NL", DType::IQ4NL),
        ("IQ4_XS", DType::IQ4XS),
        ("F16", DType::F16),
        ("BF16", DType::BF16),
    ] {
        let out = tmp(&format!("q-{name}.gguf"));
        let r = quantize_file(&src, &out, t, false, 2).unwrap();
        assert!(r.quantized >= 1, "{name}: {r:?}");
        let g = Gguf::open(&out).unwrap();
        let want = Gguf::open(&src).unwrap();
        let ti = g.tensor("input").unwrap();
        assert_eq!(ti.dtype, t, "{name}");
        let wq = want.tensor(&format!("{name}.q")).unwrap();
        assert!(g.tensor_data(ti) == want.tensor_data(wq), "{name}: bytes differ from ggml's");
        // Already-quantized tensors are copied unless requantizing.
        let other = g.tensor("Q2_K.q").unwrap();
        assert_eq!(other.dtype, DType::Q2K);
        assert!(g.u64("general.file_type").unwrap() > 0, "{name}: file type set");
        assert_eq!(g.str("fixture.source").unwrap(), want.str("fixture.source").unwrap());
        std::fs::remove_file(&out).ok();
    }
}

fn logits(path: &std::path::Path, tokens: &[u32]) -> Vec<Vec<f32>> {
    logits_with(path, tokens, true)
}

/// Logits of every token, with the matrices repacked at load or in the file's layout.
fn logits_with(path: &std::path::Path, tokens: &[u32], repack: bool) -> Vec<Vec<f32>> {
    let cfg = EngineConfig { n_ctx: 64, n_batch: 64, n_seq_max: 1, n_threads: 2, pin: false, repack, ..Default::default() };
    let mut e = Engine::load(path, cfg).unwrap();
    let mut out = Vec::new();
    e.feed(0, tokens, true, |l| out.extend((0..l.rows()).map(|i| l.row(i).to_vec()))).unwrap();
    out
}

/// Requantize SmolLM2 (Q4_1) to other types and back into the engine: the logits move by what
/// each type's precision allows and the next-token choice holds where it is clear.
#[test]
fn quantized_model_round_trip() {
    let src = corelm_engine::models_dir().join("SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(src.exists(), "{} missing: run scripts/fetch_models.py all", src.display());
    // "The capital of France is Paris. The capital of Germany is" and more, as token ids.
    let tokens: Vec<u32> = vec![1, 504, 3458, 282, 4649, 314, 7042, 30, 378, 3458, 282, 6717, 314, 10709, 30, 378];
    let base = logits(&src, &tokens);
    // Bounds on the mean |Δlogit| (measured 0.24, 0.44, 2.8, 3.2: SmolLM2's tied embedding
    // is Q8_0 in the original and suffers most at 4-5 bits; its perplexity on a text moves
    // the same way in llama.cpp, which computes bit-identical files, see check_quantize.py).
    // F16 and BF16 hold the original's values (nearly: BF16 rounds them to 8 bits) and take
    // the dense batch tiles in prefill.
    for (t, bound) in [(DType::Q8_0, 0.4), (DType::Q6K, 0.7), (DType::Q5_1, 4.0), (DType::Q4_0, 5.0), (DType::IQ4XS, 3.0), (DType::F16, 0.4), (DType::BF16, 0.4)] {
        let out = tmp(&format!("smol-{t}.gguf"));
        let r = quantize_file(&src, &out, t, true, 2).unwrap();
        assert!(r.quantized > 0, "{t}: {r:?}");
        let g = Gguf::open(&out).unwrap();
        assert_eq!(g.tensor("blk.0.attn_norm.weight").unwrap().dtype, DType::F32, "vectors stay F32");
        assert_eq!(g.str("general.architecture").unwrap(), "llama");
        let q = logits(&out, &tokens);
        let (mut worst, mut sum, mut n) = (0f32, 0f64, 0usize);
        for (i, (a, b)) in base.iter().zip(&q).enumerate() {
            worst = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(worst, common::max_nan);
            sum += a.iter().zip(b).map(|(x, y)| (x - y).abs() as f64).sum::<f64>();
            n += a.len();
            let mut top: Vec<usize> = (0..a.len()).collect();
            top.sort_by(|&x, &y| a[y].total_cmp(&a[x]));
            let (best, second) = (top[0], top[1]);
            let best_q = (0..b.len()).max_by(|&x, &y| b[x].total_cmp(&b[y])).unwrap();
            if a[best] - a[second] > 4.0 * bound {
                assert_eq!(best_q, best, "{t}: position {i} changed its clear argmax");
            }
        }
        // Repacked at load (all but F16/BF16 on AVX2 and AVX-512; IQ4_XS only where rows are
        // whole super-blocks, SmolLM2's `ffn_down`, the others IQ4_NL) or not, the same bits: 15 rows
        // take the eight- and four-row tiles and the GEMV.
        let (plain, packed) = (logits_with(&out, &tokens[..15], false), logits_with(&out, &tokens[..15], true));
        for (i, (a, b)) in plain.iter().zip(&packed).enumerate() {
            assert!(a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits()), "{t}: row {i} differs once repacked");
        }
        let mean = sum / n as f64;
        eprintln!("{t}: {} tensors quantized, |Δlogit| vs the Q4_1 original: mean {mean:.4}, worst {worst:.3}", r.quantized);
        assert!(worst > 0.0 && mean <= bound as f64, "{t}: mean |Δlogit| {mean} above {bound}");
        std::fs::remove_file(&out).ok();
    }
}

/// FNV-1a over the bits of every logit of SmolLM2 requantized to F16: 12 prompt tokens in one
/// pass (the batch dots and tiles), then 3 tokens one by one (the single-row dots).
fn f16_logits_hash() -> u64 {
    let src = corelm_engine::models_dir().join("SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(src.exists(), "{} missing: run scripts/fetch_models.py all", src.display());
    let out = tmp("smol-f16-hash.gguf");
    quantize_file(&src, &out, DType::F16, true, 2).unwrap();
    let tokens: [u32; 15] = [1, 504, 3458, 282, 4649, 314, 7042, 30, 378, 3458, 282, 6717, 314, 10709, 30];
    let cfg = EngineConfig { n_ctx: 64, n_batch: 64, n_seq_max: 1, n_threads: 2, pin: false, ..Default::default() };
    let mut e = Engine::load(&out, cfg).unwrap();
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    let mut mix = |row: &[f32]| row.iter().for_each(|v| h = (h ^ v.to_bits() as u64).wrapping_mul(0x0100_0000_01b3));
    e.feed(0, &tokens[..12], true, |l| (0..l.rows()).for_each(|i| mix(l.row(i)))).unwrap();
    for &t in &tokens[12..] {
        e.feed(0, &[t], true, |l| mix(l.row(0))).unwrap();
    }
    std::fs::remove_file(&out).ok();
    h
}

/// F16 weights give the AVX-512 table's logits bit for bit on every table that follows its F16
/// orders (ggml's AVX-512 `ggml_vec_dot_f16` for single rows, tinyBLAS's for batches): AVX-512
/// on x86 and the aarch64 tables (run under qemu by scripts/test_arm.sh). The hash was taken
/// with the AVX-512 table; the AVX2 and portable tables sum F16 in other orders (skipped).
#[test]
fn f16_model_gives_the_avx512_tables_logits() {
    use corelm_kernels::Isa;
    const AVX512_HASH: u64 = 0x29841a721ea36cc2;
    let isa = corelm_kernels::kernels().isa();
    if !matches!(isa, Isa::Avx512 | Isa::Neon | Isa::Dotprod | Isa::Sme) {
        eprintln!("the {isa} table sums F16 in an order of its own: skipped");
        return;
    }
    let h = f16_logits_hash();
    eprintln!("{isa}: F16 SmolLM2 logits hash {h:#018x}");
    assert_eq!(h, AVX512_HASH, "{isa}: F16 logits differ from the AVX-512 table's");
}

/// `--tensor-type NAME=TYPE`: a rule names its tensors and a type `--type` accepts; a rule
/// without both, or with a type that cannot be written, is refused with what is wrong.
#[test]
fn tensor_type_rules_parse_or_say_what_is_wrong() {
    use corelm_engine::quantize::{parse_tensor_type, quantize_file_with};
    assert_eq!(parse_tensor_type("attn_v=q8_0").unwrap(), ("attn_v".to_string(), DType::Q8_0));
    assert_eq!(parse_tensor_type("blk.0.ffn_down=Q6_K").unwrap(), ("blk.0.ffn_down".to_string(), DType::Q6K));
    for bad in ["attn_v", "=q8_0", "attn_v=q9_9"] {
        let e = parse_tensor_type(bad).unwrap_err();
        assert!(e.contains(bad.split('=').next_back().unwrap()) || e.contains("NAME=TYPE") || e.contains("empty"), "{bad}: {e}");
    }
    let src = fixtures().join("mistral.gguf");
    let e = quantize_file_with(&src, &tmp("never.gguf"), DType::Q4_0, &[("ffn_up".into(), DType::Q2K)], false, 2).unwrap_err();
    assert!(e.to_string().contains("Q2_K") || e.to_string().contains("q2_k"), "{e}");
}

/// A model split in three files as llama.cpp's `gguf-split` writes them (the metadata in the
/// first, `split.no`, `split.count` and `split.tensors.count` in each, the tensors in file
/// order), opened from its first file: the whole file's logits, bit for bit. (Files split by
/// `llama-gguf-split` itself gave `corelm eval` the whole files' output on SmolLM2 and Gemma 3,
/// checked by hand.)
#[test]
fn a_split_model_computes_the_whole_files_logits() {
    use corelm_gguf::{writer::Writer, Value};
    let src = corelm_engine::models_dir().join("SmolLM2-135M-Instruct.Q4_1.gguf");
    let g = Gguf::open(&src).unwrap();
    let n = g.tensors.len();
    let cut = [0, n / 3, 2 * n / 3, n];
    let paths: Vec<PathBuf> = (1..=3).map(|i| tmp(&format!("split-{i:05}-of-00003.gguf"))).collect();
    for (f, path) in paths.iter().enumerate() {
        let mut w = Writer::new();
        if f == 0 {
            for (k, v) in &g.metadata {
                w.kv(k, v.clone());
            }
        }
        w.kv("split.no", Value::U16(f as u16));
        w.kv("split.count", Value::U16(3));
        w.kv("split.tensors.count", Value::I32(n as i32));
        for t in &g.tensors[cut[f]..cut[f + 1]] {
            w.tensor(&t.name, &t.shape[..t.n_dims], t.dtype, g.tensor_data(t).to_vec());
        }
        std::fs::write(path, w.to_bytes()).unwrap();
    }
    let tokens: Vec<u32> = vec![1, 504, 3458, 282, 4649, 314, 7042, 30, 378, 3458, 282, 6717, 314, 10709, 30, 378];
    let bits = |l: Vec<Vec<f32>>| -> Vec<u32> { l.into_iter().flatten().map(f32::to_bits).collect() };
    assert_eq!(bits(logits(&paths[0], &tokens)), bits(logits(&src, &tokens)));
    for p in &paths {
        std::fs::remove_file(p).ok();
    }
}
