//! The crate's layout rule, checked on its own sources: every module imports only from
//! layers below its own (`simd` < `quant` < `exp` < `matmul` < `dispatch` < `norm`, `rope`,
//! `act` < `attention`), and no two files import each other, directly or around a circle.
//! Imports are the `crate::…`, `super::…` and `self::…` paths in the code (comments removed),
//! each resolved to the longest module path that names a file.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Top-level folders, lowest layer first; folders on one rank must not import each other.
const LAYERS: [&[&str]; 7] = [&["simd"], &["quant"], &["exp"], &["matmul"], &["dispatch"], &["norm", "rope", "act", "sparse"], &["attention"]];

fn rank(top: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&top))
}

/// Module path of every source file (`matmul/x86/avx2.rs` → `["matmul", "x86", "avx2"]`).
fn modules(dir: &Path, prefix: &[String], out: &mut BTreeMap<Vec<String>, String>) {
    for e in std::fs::read_dir(dir).expect("readable source folder") {
        let p = e.expect("entry").path();
        let name = p.file_stem().unwrap().to_string_lossy().to_string();
        if p.is_dir() {
            let mut pre = prefix.to_vec();
            pre.push(p.file_name().unwrap().to_string_lossy().to_string());
            modules(&p, &pre, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            let mut m = prefix.to_vec();
            if name != "mod" && name != "lib" {
                m.push(name);
            }
            out.insert(m, std::fs::read_to_string(&p).expect("readable source"));
        }
    }
}

/// `crate`/`super`/`self` paths in `src`: each as its segments, `{a, b}` groups expanded to
/// their first segment.
fn paths(src: &str) -> Vec<Vec<String>> {
    let code: String = src.lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n");
    let b = code.as_bytes();
    let ident = |i: usize| -> usize {
        let mut j = i;
        while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_') {
            j += 1;
        }
        j
    };
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let starts = (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_' || b[i - 1] == b':'))
            && ["crate::", "super::", "self::"].iter().any(|k| b[i..].starts_with(k.as_bytes()));
        if !starts {
            i += 1;
            continue;
        }
        let mut segs = Vec::new();
        let mut j = i;
        loop {
            let e = ident(j);
            if e == j {
                break;
            }
            segs.push(code[j..e].to_string());
            if !code[e..].starts_with("::") {
                j = e;
                break;
            }
            j = e + 2;
            if code[j..].starts_with('{') {
                let close = code[j..].find('}').map_or(code.len(), |c| j + c);
                for item in code[j + 1..close].split(',') {
                    let item = item.trim();
                    let first: String = item.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                    if !first.is_empty() {
                        let mut s = segs.clone();
                        s.push(first);
                        out.push(s);
                    }
                }
                j = close;
                break;
            }
        }
        out.push(segs);
        i = j.max(i + 1);
    }
    out
}

/// The module a path names: its longest prefix that is a module of the crate.
fn resolve(from: &[String], path: &[String], mods: &BTreeMap<Vec<String>, String>) -> Option<Vec<String>> {
    let (base, rest): (Vec<String>, &[String]) = match path.first().map(String::as_str) {
        Some("crate") => (Vec::new(), &path[1..]),
        Some("self") => (from.to_vec(), &path[1..]),
        Some("super") => {
            // A `mod.rs` is its folder's module: `super` is the folder's parent.
            let mut base = from.to_vec();
            base.pop();
            let mut rest = &path[1..];
            while rest.first().is_some_and(|s| s == "super") {
                base.pop();
                rest = &rest[1..];
            }
            (base, rest)
        }
        _ => return None,
    };
    (0..=rest.len()).rev().map(|n| [base.clone(), rest[..n].to_vec()].concat()).find(|m| mods.contains_key(m))
}

#[test]
fn modules_import_only_downward_and_without_circles() {
    let mut mods = BTreeMap::new();
    modules(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"), &[], &mut mods);
    assert!(mods.len() > 20, "found the sources ({} files)", mods.len());
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    let mut wrong = Vec::new();
    for (m, src) in &mods {
        let deps = edges.entry(m.clone()).or_default();
        for p in paths(src) {
            let Some(to) = resolve(m, &p, &mods) else { continue };
            if &to == m || to.is_empty() {
                continue; // itself, or the crate root's re-exports
            }
            if let (Some(a), Some(b)) = (m.first(), to.first()) {
                if a != b {
                    match (rank(a), rank(b)) {
                        (Some(ra), Some(rb)) if rb < ra => {}
                        _ => wrong.push(format!("{} imports {} ({})", m.join("/"), to.join("/"), p.join("::"))),
                    }
                }
            }
            deps.insert(to);
        }
    }
    assert!(wrong.is_empty(), "imports against the layer order:\n{}", wrong.join("\n"));
    // Depth-first search for a circle.
    fn visit(
        m: &Vec<String>,
        edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        state: &mut BTreeMap<Vec<String>, u8>,
        stack: &mut Vec<Vec<String>>,
    ) -> Option<String> {
        state.insert(m.clone(), 1);
        stack.push(m.clone());
        for d in edges.get(m).into_iter().flatten() {
            match state.get(d) {
                Some(1) => {
                    let at = stack.iter().position(|s| s == d).unwrap();
                    let names: Vec<String> = stack[at..].iter().chain([d]).map(|s| s.join("/")).collect();
                    return Some(names.join(" -> "));
                }
                Some(_) => {}
                None => {
                    if let Some(c) = visit(d, edges, state, stack) {
                        return Some(c);
                    }
                }
            }
        }
        stack.pop();
        state.insert(m.clone(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for m in mods.keys() {
        if !state.contains_key(m) {
            if let Some(c) = visit(m, &edges, &mut state, &mut Vec::new()) {
                panic!("circular imports: {c}");
            }
        }
    }
}

#[test]
fn the_checker_sees_paths_and_groups() {
    // Non-ASCII text before a path: the scan steps by bytes, never slicing inside a character.
    let p = paths("use crate::matmul::x86::{avx512, avx512_k as tiles_k};\n// crate::not::this\nlet s = \"× ·\"; let a = super::x::y(1);");
    assert!(p.contains(&vec!["crate".into(), "matmul".into(), "x86".into(), "avx512_k".into()]), "{p:?}");
    assert!(p.contains(&vec!["super".into(), "x".into(), "y".into()]), "{p:?}");
    assert!(!p.iter().any(|s| s.contains(&"not".to_string())), "comments are skipped: {p:?}");
}
