//! Unit tests of the block tables, the prefix cache and its eviction order.

use super::*;

fn fill(b: &mut Blocks, seq: usize, toks: &[u32]) -> Vec<usize> {
    toks.iter().map(|&t| b.append(seq, t)).collect()
}

#[test]
fn rows_follow_block_tables() {
    let mut b = Blocks::new(4, 2);
    let r0 = fill(&mut b, 0, &[1; BLOCK + 1]);
    let r1 = fill(&mut b, 1, &[2; 3]);
    assert_eq!(b.table(0), &[0, 1]);
    assert_eq!(b.table(1), &[2]);
    assert_eq!(r0[BLOCK], BLOCK);
    assert_eq!(r1[2], 2 * BLOCK + 2);
    assert_eq!((b.available(), b.needed(1, BLOCK - 3), b.needed(1, BLOCK - 2)), (1, 0, 1));
    assert_eq!(b.room(1), BLOCK - 3 + BLOCK);
    b.release(0);
    // Block 0 is full and registered: cached, not free; block 1 is free.
    assert_eq!((b.available(), b.cached()), (3, 1));
}

#[test]
fn prefix_blocks_are_shared_then_cached_then_evicted_lru() {
    let mut b = Blocks::new(6, 3);
    let prompt: Vec<u32> = (0..2 * BLOCK as u32 + 5).collect();
    fill(&mut b, 0, &prompt);
    // Same prompt: both full blocks are reused, the rest is computed.
    assert_eq!(b.attach_prefix(1, &prompt), 2 * BLOCK);
    assert_eq!(b.table(1), &b.table(0)[..2]);
    fill(&mut b, 1, &prompt[2 * BLOCK..]);
    assert_ne!(b.table(1)[2], b.table(0)[2]);
    // A prompt of exactly two blocks reuses only the first (the last token must be computed).
    assert_eq!(b.attach_prefix(2, &prompt[..2 * BLOCK]), BLOCK);
    b.release(2);
    // A different first block shares nothing, even with an equal second block.
    let mut other = prompt.clone();
    other[0] = 999;
    assert_eq!(b.attach_prefix(2, &other), 0);
    b.release(0);
    b.release(1);
    assert_eq!((b.used(), b.cached()), (0, 2));
    assert_eq!(b.attach_prefix(2, &prompt), 2 * BLOCK);
    b.release(2);
    // Filling the whole cache evicts the cached blocks (least recently released first).
    fill(&mut b, 0, &vec![7; 5 * BLOCK]);
    assert_eq!((b.cached(), b.evictions), (1, 1));
    fill(&mut b, 0, &[7]);
    assert_eq!((b.cached(), b.evictions, b.available()), (0, 2, 0));
    b.release(0);
    assert_eq!(b.attach_prefix(1, &prompt), 0);
}

/// Cutting a sequence back (rejected draft tokens) frees the blocks past the cut and takes
/// a full block it cuts into out of the prefix map; appending again rebuilds the same keys.
#[test]
fn truncation_frees_and_unregisters_what_it_cuts() {
    let mut b = Blocks::new(6, 2);
    let toks: Vec<u32> = (0..3 * BLOCK as u32).collect();
    fill(&mut b, 0, &toks);
    assert_eq!((b.used(), b.map.len()), (3, 3));
    b.truncate(0, BLOCK + 3);
    assert_eq!((b.len(0), b.table(0).len(), b.used(), b.map.len()), (BLOCK + 3, 2, 2, 1));
    // The cut block is the sequence's own again; a new sequence shares only the first.
    assert_eq!(b.attach_prefix(1, &toks), BLOCK);
    b.release(1);
    fill(&mut b, 0, &toks[BLOCK + 3..]);
    assert_eq!((b.len(0), b.map.len()), (3 * BLOCK, 3));
    assert_eq!(b.attach_prefix(1, &toks), 2 * BLOCK, "the refilled blocks are keyed as before");
    b.release(1);
    // A cut on a block boundary keeps the full block registered.
    b.truncate(0, 2 * BLOCK);
    assert_eq!((b.table(0).len(), b.map.len()), (2, 2));
    fill(&mut b, 0, &[5; BLOCK]);
    b.truncate(0, 0);
    assert_eq!((b.len(0), b.used(), b.tips[0]), (0, 0, ROOT));
}

/// A released sequence's chain is what it held, as far as it is still cached; restored
/// blocks (another cache's) attach as computed ones do, never evicting each other; erasing
/// drops the unreferenced ones.
#[test]
fn chains_restore_and_erase() {
    let mut b = Blocks::new(4, 2);
    let toks: Vec<u32> = (0..3 * BLOCK as u32 + 2).collect();
    fill(&mut b, 0, &toks);
    assert_eq!(b.chain(0), &b.table(0)[..3]);
    b.release(0);
    let chain = b.chain(0);
    assert_eq!(chain.len(), 3);
    let mut other = Blocks::new(3, 1);
    fill(&mut other, 0, &[9; 2]); // one block held: two free
    let (mut parent, mut kept) = (Blocks::root(), vec![]);
    for &c in &chain {
        let Some((blk, key, fresh)) = other.restore(parent, b.block_tokens(c), &kept) else { break };
        assert!(fresh);
        kept.push(blk);
        parent = key;
    }
    assert_eq!(kept.len(), 2, "no room for the third without evicting the first");
    assert_eq!(other.restore(Blocks::root(), b.block_tokens(chain[0]), &[]), Some((kept[0], chain_key(&b, &chain[..1]), false)));
    assert_eq!(other.attach_prefix(0, &toks), 0, "sequence 0 is not empty");
    other.release(0);
    assert_eq!(other.attach_prefix(0, &toks), 2 * BLOCK);
    // Erasing: the blocks no sequence holds leave the cache.
    assert_eq!(b.erase_last(0), 3 * BLOCK);
    assert_eq!((b.cached(), b.attach_prefix(1, &toks)), (0, 0));
}

/// Under pressure a released prefix loses its last blocks first, so what is left of it
/// still attaches.
#[test]
fn eviction_takes_a_prefix_from_its_tail() {
    let mut b = Blocks::new(4, 2);
    let toks: Vec<u32> = (0..3 * BLOCK as u32 + 1).collect();
    fill(&mut b, 0, &toks);
    b.release(0);
    assert_eq!(b.cached(), 3);
    fill(&mut b, 1, &[7; 2 * BLOCK]); // a free block and one evicted
    assert_eq!((b.evictions, b.cached()), (1, 2));
    b.release(1);
    assert_eq!(b.attach_prefix(0, &toks), 2 * BLOCK, "the prefix's first two blocks are left");
}

fn chain_key(b: &Blocks, blocks: &[u32]) -> u64 {
    blocks.iter().fold(ROOT, |k, &x| chain(k, b.block_tokens(x)))
}

/// Rows stored for scattered cells read back as stored (f32 exactly; F16 and Q8_0 within
/// their rounding), every head of every cell in place, other layers and cells untouched.
#[test]
fn cells_stored_read_back() {
    let kernels = corelm_kernels::kernels();
    let (heads, hd, cells) = (2, 64, [3u32, 5, 6, 40]);
    let k: Vec<f32> = (0..cells.len() * heads * hd).map(|i| ((i * 37 % 101) as f32 - 50.0) / 16.0).collect();
    let v: Vec<f32> = k.iter().map(|x| -0.5 * x).collect();
    for (t, tol) in [(DType::F32, 0.0), (DType::F16, 2e-3), (DType::Q8_0, 0.03)] {
        let mut kv = KvCache::new(2, 64, heads, hd, (t, t), 1, &Place::Any).unwrap();
        kv.store_cells(kernels, 1, &cells, &k, &v);
        let (mut k2, mut v2) = (vec![0.0; k.len()], vec![0.0; v.len()]);
        kv.load_cells(kernels, 1, &cells, &mut k2, &mut v2);
        for (a, b) in k.iter().chain(&v).zip(k2.iter().chain(&v2)) {
            assert!((a - b).abs() <= tol * a.abs().max(1.0), "{t}: {a} read back as {b}");
        }
        kv.load_cells(kernels, 0, &cells, &mut k2, &mut v2);
        kv.load_cells(kernels, 1, &[4], &mut k2[..heads * hd], &mut v2[..heads * hd]);
        assert!(k2.iter().chain(&v2).all(|&x| x == 0.0), "{t}: rows not stored read back as zero");
    }
}
