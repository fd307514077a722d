//! Per-worker cosine/sine tables for the RoPE nodes of a pass. Every layer rotates Q and K of
//! the same positions with the same parameters, so a worker computes each of its rows' table
//! (`n_rot / 2` cosines and sines, `rope::rope_cache`) once per pass instead of at every node:
//! on a 512-token Gemma 3 prefill the scalar `cos`/`sin` calls were most of the RoPE time.
//!
//! A table is valid for a row while the row's position and the node's parameters are those it
//! was computed for; two tables are kept, for models that alternate two sets of parameters
//! (Gemma 3's local and global layers). Sized at planning: nothing allocates per pass.

use crate::tensor::RopeParams;
use corelm_kernels::rope;

/// What a table depends on besides the position: the angles' parameters (`rope::Angles`, as
/// bits), the rotated width and the frequency-factor weight (by address; weights do not move).
type Key = ([u32; 6], usize, usize, u128);

struct Table {
    key: Option<Key>,
    /// Position each row's entry was computed for.
    pos: Vec<i32>,
    /// `[row][n_rot]`: cosines then sines.
    data: Vec<f32>,
}

pub struct RopeTables {
    tables: [Table; 2],
    /// The table to replace next.
    next: usize,
    max_rot: usize,
}

impl RopeTables {
    /// Room for `rows` rows (a worker's share of the largest batch) of up to `max_rot` values.
    pub fn new(rows: usize, max_rot: usize) -> Self {
        let table = || Table { key: None, pos: vec![i32::MIN; rows], data: vec![0.0; rows * max_rot] };
        RopeTables { tables: [table(), table()], next: 0, max_rot }
    }

    /// The tables of the rows at positions `pos` for a node with parameters `p` and frequency
    /// factors `freqs`: `[row][n_rot]`, rows computed only where missing.
    pub fn get(&mut self, pos: &[i32], p: &RopeParams, freqs: Option<&[f32]>) -> &[f32] {
        let n = p.n_rot;
        assert!(n <= self.max_rot && pos.len() <= self.tables[0].pos.len(), "rope table sized at planning");
        let a = p.angles();
        let key = ([a.base, a.freq_scale, a.mscale, a.ext_factor, a.corr_dims[0], a.corr_dims[1]].map(f32::to_bits), n, freqs.map_or(0, |f| f.as_ptr() as usize), a.still);
        let slot = match self.tables.iter().position(|t| t.key == Some(key)) {
            Some(s) => s,
            None => {
                let s = self.next;
                self.next = 1 - s;
                let t = &mut self.tables[s];
                t.key = Some(key);
                t.pos.fill(i32::MIN);
                s
            }
        };
        let t = &mut self.tables[slot];
        for (i, &ps) in pos.iter().enumerate() {
            if t.pos[i] != ps {
                rope::rope_cache(ps, n, &a, freqs, &mut t.data[i * n..(i + 1) * n]);
                t.pos[i] = ps;
            }
        }
        &t.data[..pos.len() * n]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(base: f32, n_rot: usize) -> RopeParams {
        RopeParams::plain(1, n_rot, n_rot, base, 1.0, true)
    }

    /// Entries equal a fresh `rope_cache` whatever the sequence of lookups: positions moving,
    /// two parameter sets alternating, a third evicting one, fewer rows than before.
    #[test]
    fn tables_match_fresh_computation() {
        let mut t = RopeTables::new(4, 64);
        let (a, b, c) = (params(10000.0, 64), params(1e6, 64), params(500.0, 32));
        let steps: [(&[i32], &RopeParams); 7] =
            [(&[0, 1, 2, 3], &a), (&[0, 1, 2, 3], &b), (&[0, 1, 2, 3], &a), (&[4, 5], &a), (&[4, 5, 6, 7], &c), (&[7], &b), (&[4, 9, 6], &a)];
        for (pos, p) in steps {
            let got = t.get(pos, p, None).to_vec();
            for (i, &ps) in pos.iter().enumerate() {
                let mut want = vec![0f32; p.n_rot];
                rope::rope_cache(ps, p.n_rot, &p.angles(), None, &mut want);
                assert_eq!(&got[i * p.n_rot..(i + 1) * p.n_rot], &want[..], "pos {ps} base {}", p.base);
            }
        }
    }
}
