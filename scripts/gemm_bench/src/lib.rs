//! What the harness's timers share: their random operands, the weight types they take by
//! name, and the timing loop.

/// Uniform values in [-1, 1) from a fixed seed (xorshift), so runs time the same operands.
pub fn uniform() -> impl FnMut() -> f32 {
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        (seed >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }
}

/// A weight type by its name (`--type`).
pub fn weight_type(name: &str) -> corelm_kernels::DType {
    use corelm_kernels::DType;
    match name.to_ascii_lowercase().as_str() {
        "q4_0" => DType::Q4_0,
        "q4_1" => DType::Q4_1,
        "q5_0" => DType::Q5_0,
        "q5_1" => DType::Q5_1,
        "q8_0" => DType::Q8_0,
        "q4_k" => DType::Q4K,
        "q6_k" => DType::Q6K,
        other => panic!("--type {other}: one of q4_0 q4_1 q5_0 q5_1 q8_0 q4_k q6_k"),
    }
}

/// Seconds per call of `call(i)`: `warm` calls first, then the best of five rounds of `reps`.
pub fn best_of_five(reps: usize, warm: usize, mut call: impl FnMut(usize)) -> f64 {
    for i in 0..warm {
        call(i);
    }
    let mut best = f64::MAX;
    for _ in 0..5 {
        let start = std::time::Instant::now();
        for i in 0..reps {
            call(i);
        }
        best = best.min(start.elapsed().as_secs_f64() / reps as f64);
    }
    best
}

/// The matrix timers' arguments: weight type, inner dimension, output columns, activation rows
/// and the panel GEMM's register tile height and column block (0: the engine's defaults),
/// matrix copies, calls per round.
#[derive(Clone, Copy)]
pub struct Opts {
    pub t: corelm_kernels::DType,
    pub k: usize,
    pub n: usize,
    pub rows: usize,
    pub mr: usize,
    pub nc: usize,
    pub copies: usize,
    pub reps: usize,
}

impl Opts {
    /// `defaults` with the command line's `--type --k --n --rows --mr --nc --copies --reps` applied.
    pub fn parse(defaults: Opts) -> Opts {
        let mut o = defaults;
        let mut args = std::env::args().skip(1);
        while let Some(a) = args.next() {
            let v = args.next().unwrap_or_else(|| panic!("{a} takes a value"));
            let num = || v.parse::<usize>().unwrap_or_else(|_| panic!("{a}: a number"));
            match a.as_str() {
                "--type" => o.t = weight_type(&v),
                "--k" => o.k = num(),
                "--n" => o.n = num(),
                "--rows" => o.rows = num(),
                "--mr" => o.mr = num(),
                "--nc" => o.nc = num(),
                "--copies" => o.copies = num(),
                "--reps" => o.reps = num(),
                other => panic!("unknown argument {other}"),
            }
        }
        assert!(o.k % o.t.block_size() == 0 && o.n % 4 == 0 && o.copies >= 1, "k a multiple of the type's block, n of 4");
        o
    }
}
