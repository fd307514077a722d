//! Thread pool: jobs reach every worker, barriers order phases under stress, groups sync only
//! their members, and the pool splits and re-joins.

use corelm_core::threads::{PoolConfig, ThreadPool, Worker};
use std::sync::atomic::{AtomicUsize, Ordering};

fn pool(n: usize) -> ThreadPool {
    ThreadPool::new(PoolConfig { n_threads: n, cpus: vec![] })
}

#[test]
fn every_worker_runs_every_job() {
    let p = pool(4);
    let hits = AtomicUsize::new(0);
    for _ in 0..200 {
        p.run(&|_w: &Worker| {
            hits.fetch_add(1, Ordering::Relaxed);
        });
    }
    assert_eq!(hits.load(Ordering::Relaxed), 800);
}

#[test]
fn global_barrier_orders_phases_under_stress() {
    // Each round, every worker increments the counter, meets at the barrier, and checks that
    // all increments of the round are visible, then meets again before the next round.
    let n = 5; // more workers than cores, to exercise the yield path
    let p = pool(n);
    let counter = AtomicUsize::new(0);
    let failures = AtomicUsize::new(0);
    p.run(&|w: &Worker| {
        for round in 1..=2000 {
            counter.fetch_add(1, Ordering::Relaxed);
            w.global_barrier();
            if counter.load(Ordering::Relaxed) != round * w.nth {
                failures.fetch_add(1, Ordering::Relaxed);
            }
            w.global_barrier();
        }
    });
    assert_eq!(failures.load(Ordering::Relaxed), 0);
    assert_eq!(counter.load(Ordering::Relaxed), 2000 * n);
}

#[test]
fn groups_sync_independently_then_rejoin() {
    let mut p = pool(4);
    assert!(p.split(&[3, 2]).is_err());
    p.split(&[1, 3]).unwrap();
    assert_eq!(p.groups(), &[0..1, 1..4]);
    let counters = [AtomicUsize::new(0), AtomicUsize::new(0)];
    let failures = AtomicUsize::new(0);
    let seen = AtomicUsize::new(0);
    p.run(&|w: &Worker| {
        assert_eq!(w.groups().len(), 2);
        seen.fetch_add(w.group_nth * 10 + w.group, Ordering::Relaxed);
        // Groups run different numbers of rounds: a group barrier must not wait for the other
        // group (it would deadlock if it did).
        let rounds = if w.group == 0 { 10 } else { 1000 };
        for round in 1..=rounds {
            counters[w.group].fetch_add(1, Ordering::Relaxed);
            w.barrier();
            if counters[w.group].load(Ordering::Relaxed) != round * w.group_nth {
                failures.fetch_add(1, Ordering::Relaxed);
            }
            w.barrier();
        }
        // Then everybody meets.
        w.global_barrier();
    });
    assert_eq!(failures.load(Ordering::Relaxed), 0);
    assert_eq!(seen.load(Ordering::Relaxed), 10 + 3 * (30 + 1));
    assert_eq!(counters[0].load(Ordering::Relaxed), 10);
    assert_eq!(counters[1].load(Ordering::Relaxed), 3000);

    p.rejoin();
    let n = AtomicUsize::new(0);
    p.run(&|w: &Worker| {
        assert_eq!((w.group, w.group_nth), (0, 4));
        w.barrier();
        n.fetch_add(w.group_ith, Ordering::Relaxed);
    });
    assert_eq!(n.load(Ordering::Relaxed), 1 + 2 + 3);
}

#[test]
fn parked_workers_wake_for_new_jobs() {
    let p = pool(3);
    let hits = AtomicUsize::new(0);
    for _ in 0..3 {
        // Long enough for idle workers to give up spinning and park.
        std::thread::sleep(std::time::Duration::from_millis(30));
        p.run(&|_w: &Worker| {
            hits.fetch_add(1, Ordering::Relaxed);
        });
    }
    assert_eq!(hits.load(Ordering::Relaxed), 9);
}

#[test]
fn single_thread_pool_runs_inline() {
    let p = pool(1);
    let hits = AtomicUsize::new(0);
    p.run(&|w: &Worker| {
        w.barrier();
        w.global_barrier();
        hits.fetch_add(1, Ordering::Relaxed);
    });
    assert_eq!(hits.load(Ordering::Relaxed), 1);
}

#[test]
fn pinning_pools_do_not_shrink_later_pools_or_leak_affinity() {
    let allowed = corelm_core::threads::allowed_cpus();
    let cores = corelm_core::placement::physical_cores();
    {
        let _p = ThreadPool::new(PoolConfig { n_threads: 1, cpus: vec![cores[0]] });
        // While the caller is pinned, the process's CPUs are still all visible.
        assert_eq!(corelm_core::threads::allowed_cpus(), allowed);
        assert_eq!(corelm_core::placement::physical_cores(), cores);
    }
    // After the pool is gone, a fresh thread spawned by the caller may run anywhere again.
    let seen = std::thread::spawn(|| {
        // SAFETY: plain sched_getaffinity into a zeroed cpu_set_t for this thread.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set);
            (0..libc::CPU_SETSIZE as usize).filter(|&c| libc::CPU_ISSET(c, &set)).count()
        }
    })
    .join()
    .unwrap();
    assert_eq!(seen, allowed.len());
}

#[test]
#[allow(clippy::single_range_in_vec_init)] // one-group views are the point
fn views_run_on_their_workers_only_and_number_them_from_zero() {
    let mut p = pool(6);
    p.split(&[3, 3]).unwrap();
    // A decode-style view: the first two workers of each group of three.
    let v = p.add_view(&[0..2, 3..5]).unwrap();
    assert_eq!(p.view_groups(v), &[0..2, 2..4]);
    assert!(p.add_view(&[0..2, 1..3]).is_err(), "overlapping groups");
    assert!(p.add_view(&[0..7]).is_err(), "outside the pool");
    assert!(p.add_view(&[0..2, 2..2]).is_err(), "an empty group");
    for _ in 0..200 {
        let ran = AtomicUsize::new(0);
        let ids = AtomicUsize::new(0);
        let failures = AtomicUsize::new(0);
        let counters = [AtomicUsize::new(0), AtomicUsize::new(0)];
        p.run_view(v, &|w: &Worker| {
            ran.fetch_add(1, Ordering::Relaxed);
            ids.fetch_add(1 << (4 * w.ith), Ordering::Relaxed);
            if w.nth != 4 || w.group_nth != 2 || w.ith != w.group * 2 + w.group_ith {
                failures.fetch_add(1, Ordering::Relaxed);
            }
            for round in 1..=20 {
                counters[w.group].fetch_add(1, Ordering::Relaxed);
                w.barrier();
                if counters[w.group].load(Ordering::Relaxed) != round * 2 {
                    failures.fetch_add(1, Ordering::Relaxed);
                }
                w.barrier();
            }
            // The view's global barrier counts its four workers, not the pool's six.
            w.global_barrier();
        });
        assert_eq!(ran.load(Ordering::Relaxed), 4);
        assert_eq!(ids.load(Ordering::Relaxed), 0x1111, "view indices 0..4, each once");
        assert_eq!(failures.load(Ordering::Relaxed), 0);
        // View 0 still runs every worker in the split's groups.
        let all = AtomicUsize::new(0);
        p.run(&|w: &Worker| {
            w.global_barrier();
            all.fetch_add(w.group_nth, Ordering::Relaxed);
        });
        assert_eq!(all.load(Ordering::Relaxed), 18);
    }
    // A view without worker 0 (the caller): the caller only waits.
    let w0 = p.add_view(&[1..3]).unwrap();
    let ran = AtomicUsize::new(0);
    p.run_view(w0, &|w: &Worker| {
        w.global_barrier();
        ran.fetch_add(w.ith + 1, Ordering::Relaxed);
    });
    assert_eq!(ran.load(Ordering::Relaxed), 3);
    // Splitting again drops the views.
    p.split(&[6]).unwrap();
    assert_eq!(p.groups(), &[0..6]);
}

#[test]
fn a_panicking_worker_fails_the_job_not_the_pool() {
    let p = pool(3);
    for culprit in [0, 2] {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            p.run(&|w: &Worker| {
                w.global_barrier();
                if w.ith == culprit {
                    panic!("kernel bug on worker {culprit}");
                }
                // The others wait for it at the next barrier, which gives up.
                w.global_barrier();
            })
        }));
        let msg = r.unwrap_err();
        let text = msg.downcast_ref::<String>().cloned().or(msg.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default();
        if culprit == 0 {
            assert_eq!(text, "kernel bug on worker 0", "the caller's own panic comes back as it was");
        } else {
            assert!(text.contains("a worker thread panicked"), "{text}");
        }
        // The pool still works, barriers counted afresh.
        let n = AtomicUsize::new(0);
        p.run(&|w: &Worker| {
            for _ in 0..100 {
                w.global_barrier();
            }
            n.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(n.load(Ordering::Relaxed), 3);
    }
}
