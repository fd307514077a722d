//! Online neuron balancing between the accelerator and the CPU (KAIROX §5.3, Algorithm 1;
//! `--accel-policy`).
//!
//! With a policy other than `static`, each offloaded layer gets an equal share of
//! `--accel-mem` as slots of [`BalanceConfig::group`] neurons (grouped by the calibration's firing
//! frequency, hottest first, so a group's neurons fire alike; in index order without it), the
//! CPU keeps every neuron's weights, and the graph's sparse nodes skip the neurons the device
//! holds at each pass (`Offload::resident`). After a layer's pass [`Online`] turns the CPU's
//! gate product (an exact predictor of which neurons fired) into group activities, asks the
//! [`Balancer`] for moves, and issues them at once: the group's gate and up rows and its down
//! column (neuron-major Q8_0), one contiguous run each of the host copies reordered at load by
//! group, written into the evicted group's rows (`HotFfn::load`), and the residency mask
//! flipped to match. The layer's
//! next pass is the first to use them, on both sides.
//!
//! Transfers: wgpu gives one queue, so the loads are queued behind the current layer's
//! readback (the critical merge is already done when they are issued) and run ahead of the
//! next submission, during the other layers' CPU work. Layer 0's loads are issued at the end
//! of its pass and overlap layers 1.. and sampling (the live pipeline's prefetch of layer 0).
//! The time spent issuing loads and waiting on passes that carried them is the I/O stall the
//! adaptive policy reacts to ([`BalanceStats`] reports it).
//!
//! A lost device loses nothing running: the failed layer's device part is recomputed on the
//! CPU from the saved input, the masks are cleared, and the CPU computes every neuron after.

mod online;
mod policy;

pub use online::{BalanceStats, Online};
pub use policy::{BalanceConfig, Balancer, Move, Policy};
