//! The portable instance of the column-key drivers' arithmetic
//! ([`ColumnOps`](super::drive::ColumnOps)): `model.rs`'s steps on plain floats, each
//! element's chain in the model's order, so a driver on it (the pipeline's phases on the
//! portable table, `pipe.rs`) gives the model's bits.

use super::drive::ColumnOps;
use super::model::{rescale_add, softmax_step, C};

/// The portable instance.
pub(crate) struct PortableOps;

impl ColumnOps for PortableOps {
    type Scores = [f32; C];

    fn zero(&self) -> [f32; C] {
        [0.0; C]
    }

    fn store(&self, s: [f32; C], out: &mut [f32; C]) {
        *out = s;
    }

    fn load(&self, p: &[f32; C]) -> [f32; C] {
        *p
    }

    fn scores<const NH: usize>(&self, q: &[*const f32], hd: usize, kt: *const half::f16, _ask: Option<(*const u8, *const u8)>) -> [[f32; C]; NH] {
        assert!(q.len() >= NH);
        let mut s = [[0.0f32; C]; NH];
        for d in 0..hd {
            for j in 0..C {
                // SAFETY: the trait's contract: `kt` holds `hd · 16` F16, each query `hd` f32.
                let k = unsafe { *kt.add(d * C + j) }.to_f32();
                for (i, s) in s.iter_mut().enumerate() {
                    // SAFETY: as above.
                    s[j] = unsafe { *q[i].add(d) }.mul_add(k, s[j]);
                }
            }
        }
        s
    }

    fn softmax(&self, s: [f32; C], vis: u16, scale: f32, m: &mut f32, l: &mut [f32; C], p: &mut [f32; C]) -> f32 {
        if vis == 0 {
            *p = [0.0; C];
            return 1.0;
        }
        *p = s;
        softmax_step(p, vis, scale, m, l)
    }

    fn values<const NH: usize, const NV: usize>(&self, p: &[[f32; C]], corr: &[f32], vis: &[u16], acc: &mut [f32], hd: usize, vb: *const half::f16) {
        assert!(p.len() >= NH && corr.len() >= NH && vis.len() >= NH && acc.len() >= NH * hd);
        for i in (0..NH).filter(|&i| vis[i] != 0) {
            for d0 in (0..hd).step_by(C) {
                let e1 = C.min(hd - d0);
                let mut w = [0.0f32; C];
                for (j, &pj) in p[i].iter().enumerate().filter(|(_, &pj)| pj != 0.0) {
                    for (e, w) in w[..e1].iter_mut().enumerate() {
                        // SAFETY: the trait's contract: 16 rows of `hd` F16 at `vb`.
                        *w = pj.mul_add(unsafe { *vb.add(j * hd + d0 + e) }.to_f32(), *w);
                    }
                }
                rescale_add(&mut acc[i * hd + d0..i * hd + d0 + e1], corr[i], &w[..e1]);
            }
        }
    }
}
