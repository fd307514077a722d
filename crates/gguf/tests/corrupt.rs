//! The reader on valid, corrupt and hostile files: errors name the field, nothing panics, and no
//! count from the file drives a large allocation.

use corelm_gguf::writer::Writer;
use corelm_gguf::{Array, Error, GgmlType, Gguf, Value};
use proptest::prelude::*;

fn sample() -> Writer {
    let mut w = Writer::new();
    w.kv("general.architecture", Value::String("llama".into()))
        .kv("a.u8", Value::U8(7))
        .kv("a.i8", Value::I8(-7))
        .kv("a.u16", Value::U16(65535))
        .kv("a.i16", Value::I16(-300))
        .kv("a.u32", Value::U32(1 << 31))
        .kv("a.i32", Value::I32(-5))
        .kv("a.f32", Value::F32(1.5))
        .kv("a.bool", Value::Bool(true))
        .kv("a.u64", Value::U64(u64::MAX))
        .kv("a.i64", Value::I64(i64::MIN))
        .kv("a.f64", Value::F64(-2.25))
        .kv("a.strs", Value::Array(Array::String(vec!["x".into(), "héllo".into(), String::new()])))
        .kv("a.f32s", Value::Array(Array::F32(vec![1.0, -1.0])))
        .kv("a.bools", Value::Array(Array::Bool(vec![true, false])))
        .kv(
            "a.nested",
            Value::Array(Array::Array(vec![Array::I32(vec![1, 2]), Array::I32(vec![3])])),
        );
    w.tensor("t.f32", &[4, 2], GgmlType::F32, (0..32).collect());
    w.tensor("t.q8", &[64], GgmlType::Q8_0, vec![1; 68]);
    w
}

#[test]
fn round_trip_every_value_type() {
    for version in [2, 3] {
        let mut w = sample();
        w.version = version;
        let g = Gguf::from_bytes(w.to_bytes()).unwrap();
        assert_eq!(g.version, version);
        assert_eq!(g.str("general.architecture").unwrap(), "llama");
        assert_eq!(g.get("a.u8"), Some(&Value::U8(7)));
        assert_eq!(g.get("a.i8"), Some(&Value::I8(-7)));
        assert_eq!(g.get("a.u16"), Some(&Value::U16(65535)));
        assert_eq!(g.get("a.i16"), Some(&Value::I16(-300)));
        assert_eq!(g.u64("a.u32").unwrap(), 1 << 31);
        assert_eq!(g.get("a.i32"), Some(&Value::I32(-5)));
        assert_eq!(g.f32("a.f32").unwrap(), 1.5);
        assert_eq!(g.opt_bool("a.bool").unwrap(), Some(true));
        assert_eq!(g.u64("a.u64").unwrap(), u64::MAX);
        assert_eq!(g.get("a.i64"), Some(&Value::I64(i64::MIN)));
        assert_eq!(g.get("a.f64"), Some(&Value::F64(-2.25)));
        let strs = g.opt_array("a.strs").unwrap().unwrap();
        assert_eq!(strs, &Array::String(vec!["x".into(), "héllo".into(), String::new()]));
        assert_eq!(g.opt_array("a.bools").unwrap().unwrap(), &Array::Bool(vec![true, false]));
        let nested = g.opt_array("a.nested").unwrap().unwrap();
        assert_eq!(nested.len(), 2);
        let t = g.tensor("t.f32").unwrap();
        assert_eq!(t.shape, [4, 2, 1, 1]);
        assert_eq!(g.tensor_data(t), &(0..32).collect::<Vec<u8>>()[..]);
        let q = g.tensor("t.q8").unwrap();
        assert_eq!(q.n_bytes, 68);
        assert_eq!(q.offset % 32, 0);
    }
}

#[test]
fn typed_getters_name_the_key() {
    let g = Gguf::from_bytes(sample().to_bytes()).unwrap();
    let e = g.u64("general.architecture").unwrap_err().to_string();
    assert!(e.contains("general.architecture") && e.contains("string"), "{e}");
    let e = g.f32("no.such.key").unwrap_err().to_string();
    assert!(e.contains("no.such.key"), "{e}");
}

#[test]
fn bad_magic_and_version() {
    let mut b = sample().to_bytes();
    b[0] = b'X';
    assert!(matches!(Gguf::from_bytes(b), Err(Error::BadMagic { .. })));
    let mut w = sample();
    w.version = 1;
    let e = Gguf::from_bytes(w.to_bytes()).err().unwrap().to_string();
    assert!(e.contains("version 1"), "{e}");
}

#[test]
fn every_truncation_is_an_error() {
    let b = sample().to_bytes();
    // Any prefix that cuts into the header or the tensor data must fail cleanly.
    for cut in 0..b.len() - 1 {
        let r = Gguf::from_bytes(b[..cut].to_vec());
        assert!(r.is_err(), "prefix of {cut} bytes parsed");
    }
}

#[test]
fn tensor_data_outside_file() {
    let mut w = Writer::new();
    w.tensor("big", &[1024], GgmlType::F32, vec![0; 16]);
    let e = Gguf::from_bytes(w.to_bytes()).err().unwrap().to_string();
    assert!(e.contains("'big'") && e.contains("outside"), "{e}");
}

#[test]
fn unknown_tensor_type_and_ragged_rows() {
    let mut b = Writer::new();
    b.tensor("w", &[32], GgmlType::Q8_0, vec![0; 34]);
    let mut bytes = b.to_bytes();
    // The type id sits after magic(4) version(4) counts(16) name(8+1) n_dims(4) dim(8).
    let at = 4 + 4 + 16 + 9 + 4 + 8;
    bytes[at..at + 4].copy_from_slice(&99u32.to_le_bytes());
    let e = Gguf::from_bytes(bytes).err().unwrap().to_string();
    assert!(e.contains("'w'") && e.contains("99"), "{e}");

    let mut w = Writer::new();
    w.tensor("ragged", &[33], GgmlType::Q8_0, vec![0; 68]);
    let e = Gguf::from_bytes(w.to_bytes()).err().unwrap().to_string();
    assert!(e.contains("'ragged'") && e.contains("block size"), "{e}");
}

#[test]
fn shape_overflow_and_rank() {
    let mut w = Writer::new();
    w.tensor("huge", &[1 << 40, 1 << 40], GgmlType::F32, vec![]);
    let e = Gguf::from_bytes(w.to_bytes()).err().unwrap().to_string();
    assert!(e.contains("'huge'") && e.contains("overflow"), "{e}");
    let mut w = Writer::new();
    w.tensor("rank5", &[1, 1, 1, 1, 1], GgmlType::F32, vec![0; 4]);
    let e = Gguf::from_bytes(w.to_bytes()).err().unwrap().to_string();
    assert!(e.contains("n_dims") && e.contains("'rank5'"), "{e}");
}

#[test]
fn absurd_counts_do_not_allocate() {
    // tensor_count = 2^60 in a 24-byte file.
    let mut b = b"GGUF".to_vec();
    b.extend_from_slice(&3u32.to_le_bytes());
    b.extend_from_slice(&(1u64 << 60).to_le_bytes());
    b.extend_from_slice(&0u64.to_le_bytes());
    let e = Gguf::from_bytes(b).err().unwrap().to_string();
    assert!(e.contains("tensor_count"), "{e}");

    // A string array claiming 2^62 elements.
    let mut w = Writer::new();
    w.kv("v", Value::Array(Array::String(vec!["a".into()])));
    let mut bytes = w.to_bytes();
    let at = 4 + 4 + 16 + 9 + 4 + 4; // key, value tag, array elem tag
    bytes[at..at + 8].copy_from_slice(&(1u64 << 62).to_le_bytes());
    let e = Gguf::from_bytes(bytes).err().unwrap().to_string();
    assert!(e.contains("'v'") && e.contains("cannot fit"), "{e}");

    // A string claiming to be 2^63 bytes long.
    let mut w = Writer::new();
    w.kv("s", Value::String("abc".into()));
    let mut bytes = w.to_bytes();
    let at = 4 + 4 + 16 + 9 + 4;
    bytes[at..at + 8].copy_from_slice(&(1u64 << 63).to_le_bytes());
    let e = Gguf::from_bytes(bytes).err().unwrap().to_string();
    assert!(e.contains("'s'") && e.contains("truncated"), "{e}");
}

#[test]
fn bad_alignment_and_duplicates() {
    let mut w = Writer::new();
    w.kv("general.alignment", Value::U32(3));
    let e = Gguf::from_bytes(w.to_bytes()).err().unwrap().to_string();
    assert!(e.contains("general.alignment"), "{e}");
    let mut w = Writer::new();
    w.kv("k", Value::U8(1)).kv("k", Value::U8(2));
    let e = Gguf::from_bytes(w.to_bytes()).err().unwrap().to_string();
    assert!(e.contains("duplicate") && e.contains("'k'"), "{e}");
    let mut w = Writer::new();
    w.kv("b", Value::Bool(true));
    let mut bytes = w.to_bytes();
    bytes[4 + 4 + 16 + 9 + 4] = 7; // the bool's byte, after key "b" and its type tag
    let e = Gguf::from_bytes(bytes).err().unwrap().to_string();
    assert!(e.contains("bool"), "{e}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]
    /// Random byte flips and truncations of a valid file never panic, and a success still
    /// honours the in-bounds invariant.
    #[test]
    fn mutated_files_never_panic(flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8),
                                 cut in any::<usize>()) {
        let mut b = sample().to_bytes();
        for (at, byte) in flips {
            let i = at % b.len();
            b[i] = byte;
        }
        let cut = cut % (b.len() + 1);
        b.truncate(cut.max(b.len() / 2));
        if let Ok(g) = Gguf::from_bytes(b) {
            for t in &g.tensors {
                prop_assert_eq!(g.tensor_data(t).len() as u64, t.n_bytes);
            }
        }
    }

    /// Entirely random input after a valid magic and version.
    #[test]
    fn random_bodies_never_panic(body in proptest::collection::vec(any::<u8>(), 0..512)) {
        let mut b = b"GGUF".to_vec();
        b.extend_from_slice(&3u32.to_le_bytes());
        b.extend_from_slice(&body);
        let _ = Gguf::from_bytes(b);
    }
}
