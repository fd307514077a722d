//! A slot's KV cache saved to a file and read back into another engine's prefix cache
//! (`Engine::save_slot`, `restore_slot`, `erase_slot`): the rows come back bit for bit, so a
//! prompt continued from restored blocks gives the logits it gives from the saving engine's
//! own cache; a file of another cache geometry or a damaged one is refused by name; a cache
//! without room restores what fits.

mod common;

use common::*;
use corelm_engine::{Engine, EngineConfig, Error};
use corelm_kernels::DType;

const SMOL: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

fn last(e: &mut Engine, seq: i32, toks: &[u32]) -> Vec<f32> {
    let mut out = vec![];
    e.feed(seq, toks, false, |l| out = l.row(0).to_vec()).unwrap();
    out
}

fn file(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("corelm-slot-file-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

#[test]
fn a_saved_slot_restores_into_another_engine_bit_for_bit() {
    let cfg = || EngineConfig { batch_invariant: true, ..test_config(2) };
    let (mut a, tok) = load(SMOL, cfg());
    let text = "The keeper of the northern lighthouse wrote in his log every night, ".repeat(4);
    let ids = tok.encode(&format!("{text}and on the last night he wrote"), true, true).unwrap();
    assert!(ids.len() > 48 && ids.len() % 16 != 0, "{} tokens", ids.len());
    let whole = ids.len() / 16 * 16;
    last(&mut a, 0, &ids);
    // While it runs, a slot saves the whole blocks it holds; after, those it held.
    let path = file("a.kv");
    let running = a.save_slot(0, &path, "smol").unwrap();
    a.clear_seq(0);
    let saved = a.save_slot(0, &path, "smol").unwrap();
    assert_eq!((running.n_tokens, saved.n_tokens), (whole, whole));
    assert_eq!(saved.n_bytes, std::fs::metadata(&path).unwrap().len() as usize);
    // The saving engine continues the prompt from its cache…
    let reused = a.attach_prefix(1, &ids);
    let want = last(&mut a, 1, &ids[reused..]);
    // …and a fresh engine from the restored blocks, to the bit.
    let (mut b, _) = load(SMOL, cfg());
    let r = b.restore_slot(&path, "smol").unwrap();
    assert_eq!((r.n_tokens, r.n_bytes), (whole, saved.n_bytes));
    assert_eq!(b.blocks().cached(), whole / 16);
    assert_eq!(b.attach_prefix(1, &ids), reused);
    assert_eq!(last(&mut b, 1, &ids[reused..]), want, "logits after restored blocks");
    // Restoring again finds the blocks there and writes nothing new.
    b.clear_seq(1);
    assert_eq!(b.restore_slot(&path, "smol").unwrap().n_tokens, whole);
    assert_eq!(b.blocks().cached(), whole / 16);
    // Erasing forgets what the slot held: nothing of it is cached after.
    assert_eq!(a.erase_slot(0), whole);
    assert_eq!(a.erase_slot(0), 0);
    a.clear_seq(1);
    assert_eq!(a.erase_slot(1), whole);
    assert_eq!(a.attach_prefix(2, &ids), 0);
}

#[test]
fn a_slot_file_of_another_cache_or_damaged_is_refused() {
    let (mut a, tok) = load(SMOL, test_config(2));
    let ids = tok.encode(&"one two three four five six seven eight ".repeat(6), true, true).unwrap();
    last(&mut a, 0, &ids);
    let path = file("b.kv");
    a.save_slot(0, &path, "smol").unwrap();
    let msg = |r: Result<corelm_engine::engine::SlotIo, Error>| r.unwrap_err().to_string();
    assert!(msg(a.restore_slot(&path, "other")).contains("model \"smol\""), "{}", msg(a.restore_slot(&path, "other")));
    let (mut q8, _) = load(SMOL, EngineConfig { cache_type_k: DType::Q8_0, ..test_config(2) });
    let m = msg(q8.restore_slot(&path, "smol"));
    assert!(m.contains("k_type \"F16\" (here \"Q8_0\")"), "{m}");
    let bytes = std::fs::read(&path).unwrap();
    let cut = file("cut.kv");
    std::fs::write(&cut, &bytes[..bytes.len() - 1]).unwrap();
    assert!(msg(a.restore_slot(&cut, "smol")).contains("bytes where"), "{}", msg(a.restore_slot(&cut, "smol")));
    std::fs::write(&cut, b"GGUF....").unwrap();
    assert!(msg(a.restore_slot(&cut, "smol")).contains("not a corelm slot file"));
    assert!(msg(a.save_slot(7, &path, "smol")).contains("no sequence 7"));
}

#[test]
fn a_cache_without_room_restores_what_fits() {
    let (mut a, tok) = load(SMOL, test_config(2));
    let ids = tok.encode(&"a b c d e f g h i j k l m n o p ".repeat(12), true, true).unwrap();
    last(&mut a, 0, &ids);
    a.clear_seq(0);
    let path = file("c.kv");
    let saved = a.save_slot(0, &path, "smol").unwrap();
    // Three blocks of room, one of them held by a running sequence.
    let (mut small, _) = load(SMOL, EngineConfig { n_ctx: 48, ..test_config(2) });
    last(&mut small, 0, &[1, 2, 3]);
    let r = small.restore_slot(&path, "smol").unwrap();
    assert!(saved.n_tokens > 48);
    assert_eq!(r.n_tokens, 32, "two free blocks");
    assert_eq!(small.attach_prefix(1, &ids), 32);
}
