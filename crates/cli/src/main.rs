//! `corelm`: run, chat, serve, tokenize, eval, bench, perplexity, quantize, topo.
//!
//! The model defaults to SmolLM2-135M-Instruct Q4_1 in the model cache; when it is missing the
//! project's fetch script downloads it (`scripts/fetch_models.py`).

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand};
use corelm_engine::chat::{ChatTemplate, Message};
use corelm_engine::eval::{run_case, Case};
use corelm_engine::generate::{generate_drafted, StopReason};
use corelm_engine::{Engine, EngineConfig, Tokenizer};
use corelm_kernels::DType;
use std::io::{BufRead, Write};
use std::path::PathBuf;

mod bench;
mod draft;
mod embed;
mod lora;
mod profile;
mod prompt_cache;
mod roofline;
mod sampling;
mod sparsity;
mod topo;
mod tune;

mod serve;

const DEFAULT_MODEL: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

#[derive(Parser)]
#[command(name = "corelm", version, about = "Fast LLM inference on CPUs for GGUF models")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
    /// Kernel table for every command: portable, avx2, avx512 or amx on x86-64, portable, neon,
    /// dotprod or sme on aarch64 (default: the best this CPU runs). A lower table than the CPU's forces its kernels everywhere, for measuring and
    /// testing that path; one the CPU cannot run is refused.
    #[arg(long, global = true, env = "CORELM_ISA", value_parser = parse_isa)]
    isa: Option<corelm_kernels::Isa>,
}

/// An `--isa` value this CPU runs.
fn parse_isa(s: &str) -> Result<corelm_kernels::Isa, String> {
    s.parse::<corelm_kernels::Isa>().and_then(corelm_kernels::dispatch::check).map_err(|e| e.to_string())
}

#[derive(Args, Clone)]
struct ModelArgs {
    /// GGUF file (default: SmolLM2-135M-Instruct Q4_1 from the model cache, fetched if missing).
    #[arg(short, long)]
    model: Option<PathBuf>,
    /// Worker threads (default: physical cores).
    #[arg(short, long)]
    threads: Option<usize>,
    /// Context size in tokens (KV cells).
    #[arg(short = 'c', long, default_value_t = 4096)]
    ctx_size: usize,
    /// Most tokens per forward pass. A prompt of at most this many tokens is one pass, as in
    /// llama.cpp (whose default micro-batch is 512): longer prompts split into passes give
    /// slightly different logits there, as llama.cpp's own would with a smaller batch.
    #[arg(short = 'b', long, default_value_t = 512)]
    batch_size: usize,
    /// Do not pin worker threads to cores.
    #[arg(long)]
    no_pin: bool,
    #[command(flatten)]
    place: PlaceArgs,
    #[command(flatten)]
    kernels: KernelArgs,
}

/// Where workers run and memory lives (ArcLight), shared by every command that loads a model.
#[derive(Args, Clone)]
pub(crate) struct PlaceArgs {
    /// NUMA placement, llama.cpp's modes: off (a worker per physical core, node by node; memory
    /// where first touched), distribute (workers spread evenly over the nodes; repacked weights,
    /// activation pools and KV cache interleaved over them), isolate (only the cores of the node
    /// the process started on; memory bound to that node); and tp (tensor parallelism, one
    /// shard per node: each worker group on its node's cores, its weight copies and KV rows
    /// bound to that node).
    #[arg(long, default_value = "off", env = "CORELM_NUMA")]
    pub(crate) numa: corelm_engine::NumaMode,
    /// Tensor-parallel degree: the workers split into this many groups, each computing its
    /// shard of every layer (query heads and their KV heads, Wo columns; gate/up rows, down
    /// columns; partial sums added at gathers). Default: one per NUMA node with --numa tp, else
    /// 1 (off). On a one-node machine the groups are virtual nodes.
    #[arg(long, env = "CORELM_TP")]
    pub(crate) tp: Option<usize>,
    /// Barriers inside the parallel subgraphs: async (each group's own, global ones only at
    /// scatter and gather) or lockstep (a global barrier after every node).
    #[arg(long, default_value = "async")]
    pub(crate) tp_sync: corelm_engine::TpSync,
    /// A KV head that several shards read: exchange (its keys and its values each projected
    /// on one reader, the least loaded, and stored into every reader's cache; one more global
    /// barrier per layer) or replicate (projected on every reader).
    #[arg(long, default_value = "exchange")]
    pub(crate) tp_kv: corelm_engine::TpKv,
    /// A plan file of `corelm tune`: the prefill configuration's cores and groups for the
    /// workers (it sets --threads and --tp), and the decode configuration's for short passes.
    #[arg(long, env = "CORELM_PLAN")]
    pub(crate) plan: Option<PathBuf>,
    /// Plan each graph on a roofline profile (`corelm profile`): `auto` for this machine's
    /// (measured once, cached), or a profile file. Memory-bound operators then run on the
    /// threads that saturate bandwidth (the knee) instead of every worker; same results.
    #[arg(long, env = "CORELM_ROOFLINE")]
    pub(crate) roofline: Option<String>,
    /// Share matmuls with the accelerator as the --roofline plan places them (its accelerator
    /// target: `corelm profile --accel`): each one on the CPU, or cut between the CPU and the
    /// device so both finish together. The device's columns agree with the CPU's within its f32
    /// bound, not bit for bit.
    #[arg(long)]
    pub(crate) accel_split: bool,
    /// Run the model's first N layers whole on the accelerator (a GPU through `wgpu`, or Mesa's
    /// software lavapipe): norms, attention with their KV cache, feed-forward, one submission
    /// and one read-back per pass for all of them. LLaMA, Qwen2, Qwen3 and Gemma 3 models;
    /// results within the accelerator's f32 bound of the CPU's, not bit for bit.
    #[arg(long, default_value_t = 0)]
    pub(crate) accel_layers: usize,
    /// With --accel-layers: passes of fewer tokens than this (decode steps) run those layers on
    /// the CPU, so a prefill runs on the accelerator and generation on the CPU, where one round
    /// trip per token costs more than the layers (e.g. 32). The two KV caches are kept in
    /// step. Not with --batch-invariant or --kv-layout columns [default: every pass on the
    /// accelerator]
    #[arg(long, default_value_t = 0)]
    pub(crate) accel_min_tokens: usize,
    #[command(flatten)]
    pub(crate) sparse: sparsity::SparseArgs,
    #[command(flatten)]
    pub(crate) lora: lora::LoraArgs,
}

impl PlaceArgs {
    /// The profile named by `--roofline`.
    pub(crate) fn load_roofline(&self) -> Result<Option<corelm_plan::Roofline>> {
        Ok(match self.roofline.as_deref() {
            None => None,
            Some("auto") => Some(profile::this_machine(false)?),
            Some(p) => Some(corelm_plan::Roofline::load(std::path::Path::new(p))?),
        })
    }

    /// The plan file named by `--plan`, read and checked.
    pub(crate) fn load_plan(&self) -> Result<Option<corelm_engine::plan::Plan>> {
        Ok(match &self.plan {
            Some(p) => Some(corelm_engine::plan::Plan::load(p)?),
            None => None,
        })
    }
}

/// Kernel choices, shared by every command that computes with a model except `serve` (which
/// is batch-invariant unless `--no-batch-invariant` and takes the cache types and
/// `--fast-prefill`).
#[derive(Args, Clone, Copy)]
struct KernelArgs {
    /// Compute every batch row as if alone (what `serve` does): results independent of
    /// batching, without llama.cpp's batch-size-dependent kernel choices.
    #[arg(long)]
    batch_invariant: bool,
    #[command(flatten)]
    cache: CacheArgs,
    /// Prefill with the panel GEMM: logits no longer bit-identical to llama.cpp's (summation
    /// order). With a --plan tuned on both paths (`corelm tune`) each matrix at each length
    /// takes the path timed faster; without one, x86 runs the panel on batches of 32 or more
    /// rows and the repacked tiles below that (pp512 1.2-1.7x the tiles on Zen 4), aarch64
    /// always. Attention over fewer than 64 rows (decode steps) then keeps its value
    /// accumulators in F32 instead of rounding them to F16 at every cell.
    #[arg(long)]
    fast_prefill: bool,
    /// Arm SME: this many workers run their share of the prefill GEMMs that the --roofline
    /// plan splits between the matrix unit and the vector cores on the matrix unit, the others
    /// on the vector cores, cut in the ratio of the profile's ceilings (same results). Needs
    /// --fast-prefill and a profile with an `sme` target.
    #[arg(long, default_value_t = 0)]
    matrix_workers: usize,
    /// Prefill attention as a pipeline: the scores, softmax and values of different tiles run
    /// on different workers at once (the matrix phases first on --matrix-workers' workers).
    /// Same results as without. Needs --kv-layout columns.
    #[arg(long)]
    attn_pipeline: bool,
    /// Keep the model file's row layout for every matmul instead of repacking matrices once at
    /// load into the interleaved layout of the AVX2 and AVX-512 kernels (same results, slower).
    #[arg(long)]
    no_repack: bool,
    /// Keep a barrier after every graph node, where the engine leaves out those between
    /// independent nodes and row-local chains (same results; for comparing)
    #[arg(long)]
    all_barriers: bool,
}

/// `--cache-type-k/-v`, shared by every command that loads a model.
#[derive(Args, Clone, Copy)]
pub(crate) struct CacheArgs {
    /// Element type of cached keys: f16, q8_0 or q4_0.
    #[arg(long = "cache-type-k", short = 'k', default_value = "f16", value_parser = corelm_engine::parse_cache_type)]
    pub cache_type_k: DType,
    /// Element type of cached values: f16, q8_0 or q4_0.
    #[arg(long = "cache-type-v", short = 'v', default_value = "f16", value_parser = corelm_engine::parse_cache_type)]
    pub cache_type_v: DType,
    /// Layout of cached keys: rows (ggml's; its algorithms and bits) or columns (transposed per
    /// block of 16 cells as they are stored, for the column-key kernels: AVX-512, AVX2, NEON,
    /// SME; not llama.cpp's bits; head dimensions a multiple of 16).
    #[arg(long = "kv-layout", default_value = "rows", value_parser = corelm_engine::parse_kv_layout)]
    pub kv_layout: corelm_kernels::attention::KeyLayout,
}

#[derive(Subcommand)]
enum Cmd {
    /// Generate text from a prompt, streamed to stdout.
    Run {
        #[command(flatten)]
        model: ModelArgs,
        #[command(flatten)]
        sample: sampling::SampleArgs,
        /// The prompt (special tokens such as <|im_start|> are recognised).
        #[arg(short, long, required_unless_present = "prompt_ids", default_value = "")]
        prompt: String,
        /// The prompt as comma-separated token ids instead of text (benchmarks, debugging).
        #[arg(long, value_delimiter = ',')]
        prompt_ids: Option<Vec<u32>>,
        /// Wrap the prompt as a user message with the model's chat template.
        #[arg(long)]
        chat: bool,
        /// Fill in the middle: the prompt is the text before the hole, this the text after it
        /// (in the model's FIM tokens, as `serve`'s `suffix`).
        #[arg(long, conflicts_with_all = ["chat", "prompt_ids"])]
        suffix: Option<String>,
        /// Print time per operation kind after the run.
        #[arg(long)]
        profile: bool,
        #[command(flatten)]
        cache: prompt_cache::PromptCacheArgs,
    },
    /// Interactive chat; the conversation stays in the KV cache between turns.
    Chat {
        #[command(flatten)]
        model: ModelArgs,
        #[command(flatten)]
        sample: sampling::SampleArgs,
        /// System message.
        #[arg(long)]
        system: Option<String>,
    },
    /// Serve the model over an OpenAI-compatible HTTP API with continuous batching.
    Serve(serve::ServeArgs),
    /// Embed texts: one vector per text, pooled from the final norm's rows (as /v1/embeddings).
    Embed(embed::EmbedArgs),
    /// Print the token ids of a text.
    Tokenize {
        #[arg(short, long)]
        model: Option<PathBuf>,
        text: String,
        /// Do not add BOS even if the model asks for it.
        #[arg(long)]
        no_special: bool,
        /// Treat special-token text as plain text.
        #[arg(long)]
        no_parse_special: bool,
    },
    /// Measure prompt processing and generation speed, in the manner of llama-bench.
    Bench(bench::BenchArgs),
    /// Perplexity of a text file, by llama-perplexity's protocol: chunks of --ctx-size tokens,
    /// the second half of each scored (use -c 512 to compare with llama.cpp's usual figures).
    Perplexity {
        #[command(flatten)]
        model: ModelArgs,
        /// Text file to score.
        #[arg(short, long)]
        file: PathBuf,
        /// Score at most this many chunks.
        #[arg(long)]
        chunks: Option<usize>,
        /// Print the result as one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Quantize a GGUF's F32/F16/BF16 weight matrices to one type (ggml's block semantics, so
    /// llama.cpp reads the result): q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q6_k (or f16, bf16, f32).
    Quantize {
        /// Input GGUF.
        input: PathBuf,
        /// Output GGUF (written to <output>.part, renamed when complete).
        output: PathBuf,
        #[arg(long = "type", value_parser = corelm_engine::quantize::parse_type)]
        ty: DType,
        /// Also convert matrices that are already quantized (dequantized first).
        #[arg(long)]
        allow_requantize: bool,
        /// A type for the tensors whose name contains NAME (repeatable; the first rule that
        /// matches decides), as llama-quantize's --tensor-type: e.g. attn_v=q8_0.
        #[arg(long = "tensor-type", value_name = "NAME=TYPE", value_parser = corelm_engine::quantize::parse_tensor_type)]
        tensor_types: Vec<(String, DType)>,
        /// Worker threads (default: physical cores).
        #[arg(short, long)]
        threads: Option<usize>,
    },
    /// FFN activation sparsity: collect a model's activation statistics over a text
    /// (thresholds for --sparsity), or measure the quality of sparsity levels.
    #[command(subcommand)]
    Sparsity(sparsity::SparsityCmd),
    /// Evaluate a golden case file and print its output fields as one JSON object.
    Eval {
        #[command(flatten)]
        model: ModelArgs,
        /// Case file in the format of ../shared/golden.
        #[arg(long)]
        case: PathBuf,
        /// Feed the case's prompt_token_ids + greedy_ids[:-1] instead of our own choices.
        #[arg(long)]
        teacher_forced: bool,
    },
    /// Sandwich's search: explore the machine's configurations, time them (or model them with
    /// --topology), and write a plan file with a prefill and a decode configuration.
    Tune(tune::TuneArgs),
    /// Measure (once per machine, cached) or show a roofline profile: compute ceilings per
    /// target and kernel family, and the shared memory roof.
    Profile(profile::ProfileArgs),
    /// Explain a plan file of `tune` in words (--plan), or plan a model's prefill and decode
    /// operators on a roofline profile (--model, --profile, --svg).
    Plan(roofline::PlanArgs),
    /// Print the hardware tree (packages, NUMA nodes with their memory, L3 and L2 caches, cores,
    /// PUs) and the node distance matrix, as the engine sees it.
    Topo {
        /// Another machine instead of this one: an hwloc XML file (`lstopo --of xml`; snapshots
        /// in fixtures/topo/), an hwloc synthetic description ("pack:2 numa:1 l3:8 core:8 pu:2")
        /// or a directory holding a copy of a machine's /sys.
        #[arg(long)]
        topology: Option<String>,
        /// Read this machine's /sys even where hwloc is built in.
        #[arg(long, conflicts_with = "topology")]
        sys: bool,
        /// Also run Sandwich's configuration search on the tree (group/remove transforms,
        /// cross-sections, the latency model) and print the best decode and prefill
        /// configurations for --model, modelled with the snapshot's stated profile or, for this
        /// machine, one measured here.
        #[arg(long)]
        explore: bool,
        /// Model whose workload is planned (default: SmolLM2 from the model cache).
        #[arg(short, long)]
        model: Option<PathBuf>,
        /// Prompt length of the prefill pass planned.
        #[arg(long, default_value_t = 512)]
        prompt: usize,
        /// Transforms deep the search goes.
        #[arg(long, default_value_t = 3)]
        steps: usize,
        /// Draw the TopoTree (SVG).
        #[arg(long)]
        svg: Option<PathBuf>,
    },
}


/// The model path: as given, or the default model, fetched with the project's script if absent.
fn resolve_model(m: &Option<PathBuf>) -> Result<PathBuf> {
    if let Some(p) = m {
        return Ok(p.clone());
    }
    let p = corelm_engine::models_dir().join(DEFAULT_MODEL);
    if !p.exists() {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/fetch_models.py");
        eprintln!("default model not found at {}; fetching it with {}", p.display(), script.display());
        let ok = std::process::Command::new("python3").arg(&script).arg("smollm2").status()
            .with_context(|| format!("running {}", script.display()))?
            .success();
        if !ok || !p.exists() {
            bail!("could not fetch the default model; run scripts/fetch_models.py smollm2");
        }
    }
    Ok(p)
}

/// The model's id: its file name without `.gguf` (what `serve` answers to, and slot files
/// record).
fn model_id(path: &std::path::Path) -> String {
    path.file_stem().map_or("model".into(), |s| s.to_string_lossy().into_owned())
}

fn load(m: &ModelArgs, n_seq: usize) -> Result<(Engine, Tokenizer)> {
    let path = resolve_model(&m.model)?;
    if m.place.plan.is_some() && (m.threads.is_some() || m.place.tp.is_some()) {
        bail!("--plan sets the worker threads and the tensor-parallel degree: drop --threads/--tp");
    }
    let (sparsity, accel) = m.place.sparse.load(&path)?;
    let cfg = EngineConfig {
        n_ctx: m.ctx_size,
        n_batch: m.batch_size,
        n_seq_max: n_seq,
        n_threads: m.threads.unwrap_or_else(|| corelm_engine::engine::default_threads_for(m.place.numa)),
        pin: !m.no_pin,
        numa: m.place.numa,
        tp: m.place.tp.unwrap_or(0),
        tp_sync: m.place.tp_sync,
        tp_kv: m.place.tp_kv,
        batch_invariant: m.kernels.batch_invariant,
        cache_type_k: m.kernels.cache.cache_type_k,
        cache_type_v: m.kernels.cache.cache_type_v,
        kv_layout: m.kernels.cache.kv_layout,
        attn_pipeline: m.kernels.attn_pipeline,
        fast_prefill: m.kernels.fast_prefill,
        repack: !m.kernels.no_repack,
        isa: None, // the process default, which `--isa` set
        plan: m.place.load_plan()?,
        roofline: m.place.load_roofline()?,
        matrix_workers: m.kernels.matrix_workers,
        sparsity,
        accel,
        accel_split: m.place.accel_split,
        accel_layers: m.place.accel_layers,
        accel_min_tokens: m.place.accel_min_tokens,
        elide_barriers: !m.kernels.all_barriers,
        lora: m.place.lora.specs()?,
    };
    let engine = Engine::load(&path, cfg).with_context(|| format!("loading {}", path.display()))?;
    if let Some(a) = engine.accel() {
        eprintln!("{}", sparsity::describe_accel(a));
    }
    if let Some(d) = engine.device_layers() {
        eprintln!("accel-layers: {}", d.summary());
    }
    if let Some(why) = engine.plan_note() {
        eprintln!("plan: {why}");
    }
    for a in engine.lora_adapters() {
        eprintln!("lora: {} ({} matrices, scale {})", a.path.display(), a.n_matrices(), a.scale);
    }
    if let Some(d) = engine.device() {
        eprintln!("accel-split: {}", d.summary());
    }
    let tok = Tokenizer::from_gguf(engine.gguf()).with_context(|| format!("tokenizer of {}", path.display()))?;
    Ok((engine, tok))
}

fn print_stream(s: &str) -> bool {
    let mut out = std::io::stdout().lock();
    out.write_all(s.as_bytes()).and_then(|_| out.flush()).is_ok()
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    // A closed pipe ends a printing command quietly (`corelm bench … | head -1`), as it ends
    // `cat`, rather than as a panic in `println!`. Not for `serve`, whose clients' sockets may
    // close under it and which must keep running.
    if !matches!(cli.cmd, Cmd::Serve { .. }) {
        sigpipe::reset();
    }
    if let Some(isa) = cli.isa {
        corelm_kernels::dispatch::set_default_isa(isa)?;
    }
    match cli.cmd {
        Cmd::Run { model, sample, prompt, prompt_ids, chat, suffix, profile, cache } => {
            let model_id = model_id(&resolve_model(&model.model)?);
            let (mut engine, tok) = load(&model, 1)?;
            if profile {
                engine.profile = Some(Default::default());
            }
            let ids = match (prompt_ids, suffix) {
                (Some(ids), _) => ids,
                // The context less the answer's room (`-n`).
                (None, Some(suffix)) => {
                    let budget = engine.config().n_ctx.saturating_sub(sample.n_predict);
                    corelm_engine::infill::prompt(&tok, &prompt, &suffix, &[], "", budget).context("--suffix")?
                }
                (None, None) => {
                    let text = if chat {
                        ChatTemplate::from_gguf(engine.gguf(), &tok)?.render(&[Message::new("user", &prompt)], true)?
                    } else {
                        prompt
                    };
                    tok.encode(&text, true, true)?
                }
            };
            let params = sampling::gen_params(&sample, &tok, engine.config().n_ctx)?;
            let mut draft = sample.draft.load(&engine, &tok)?;
            let reused = cache.restore(&mut engine, params.seq, &model_id, &ids)?;
            let g = generate_drafted(&mut engine, draft.as_mut(), &tok, &ids[reused..], &params, print_stream)?;
            println!();
            cache.save(&mut engine, params.seq, &model_id, ids.len())?;
            eprintln!(
                "[{} prompt tokens in {:.3} s = {:.1} t/s; {} generated in {:.3} s = {:.1} t/s; stop: {:?}; {} threads, {} kernels]",
                g.n_prompt,
                g.prefill_secs,
                g.n_prompt as f64 / g.prefill_secs,
                g.tokens.len(),
                g.decode_secs,
                g.tokens.len() as f64 / g.decode_secs.max(1e-9),
                g.reason,
                engine.config().n_threads,
                engine.kernels().isa(),
            );
            if g.mask_secs > 0.0 {
                eprintln!("[constraint mask: {:.3} ms per generated token]", 1e3 * g.mask_secs / g.tokens.len().max(1) as f64);
            }
            if g.drafted > 0 {
                let what = if draft.is_some() { "draft model" } else { "lookup" };
                eprintln!("[{what} drafts: {} fed, {} kept]", g.drafted, g.kept);
            }
            if g.shifts > 0 {
                eprintln!("[context shifts: {} in {:.1} ms]", g.shifts, 1e3 * g.shift_secs);
            }
            if let Some(p) = &engine.profile {
                let total = p.total_secs();
                eprintln!("{:<20} {:>10} {:>8} {:>7} {:>8}", "op", "ms", "nodes", "share", "GB/s");
                let mut rows = p.per_op.clone();
                rows.sort_by(|a, b| b.secs.total_cmp(&a.secs));
                for e in rows {
                    eprintln!(
                        "{:<20} {:>10.1} {:>8} {:>6.1}% {:>8}",
                        e.label(),
                        e.secs * 1e3,
                        e.nodes,
                        100.0 * e.secs / total,
                        bench::gbps(&e)
                    );
                }
            }
        }
        Cmd::Chat { model, sample, system } => chat(&model, &sample, system)?,
        Cmd::Tokenize { model, text, no_special, no_parse_special } => {
            let path = resolve_model(&model)?;
            let g = corelm_engine::engine::open_gguf(&path)?;
            let tok = Tokenizer::from_gguf(&g)?;
            let ids = tok.encode(&text, !no_special, !no_parse_special)?;
            println!("{}", serde_json::to_string(&ids)?);
        }
        Cmd::Bench(a) => bench::bench(&a)?,
        Cmd::Embed(a) => embed::embed(&a)?,
        Cmd::Serve(a) => {
            let path = resolve_model(&a.model_path())?;
            serve::serve(a, path)?;
        }
        Cmd::Quantize { input, output, ty, allow_requantize, tensor_types, threads } => {
            let t0 = std::time::Instant::now();
            let n = threads.unwrap_or_else(corelm_engine::engine::default_threads);
            let r = corelm_engine::quantize::quantize_file_with(&input, &output, ty, &tensor_types, allow_requantize, n)
                .with_context(|| format!("quantizing {}", input.display()))?;
            if let Some((name, t)) = r.fell_back.first() {
                eprintln!(
                    "{} matrices have rows that are not whole {ty} blocks and were written as {t} (e.g. {name})",
                    r.fell_back.len()
                );
            }
            let to = if tensor_types.is_empty() { ty.to_string() } else { format!("{ty} or their --tensor-type") };
            println!(
                "{}: {} tensors quantized to {to}, {} fell back, {} copied; {:.1} MB -> {:.1} MB in {:.1} s",
                output.display(),
                r.quantized,
                r.fell_back.len(),
                r.copied,
                r.bytes_in as f64 / 1e6,
                r.bytes_out as f64 / 1e6,
                t0.elapsed().as_secs_f64()
            );
        }
        Cmd::Perplexity { model, file, chunks, json } => perplexity(&model, &file, chunks, json)?,
        Cmd::Tune(a) => {
            let model = resolve_model(&a.model_path())?;
            tune::tune(&a, model)?;
        }
        Cmd::Profile(a) => profile::profile(&a)?,
        Cmd::Plan(a) => roofline::plan(&a)?,
        Cmd::Sparsity(c) => sparsity::run(c)?,
        Cmd::Topo { topology, sys, explore, model, prompt, steps, svg } => {
            let spec = if sys { Some("/sys") } else { topology.as_deref() };
            let t = corelm_topo::Topology::load_or_discover(spec)?;
            // A closed pipe (`corelm topo | head`) ends the output, not the program with a panic.
            let _ = write!(std::io::stdout().lock(), "{t}");
            if let Some(out) = svg {
                let tree = corelm_topo::sandwich::TNode::from_topology(&t);
                topo::draw_svg(&tree, &out, &format!("TopoTree of {} — {}", t.source, t.summary()))?;
                eprintln!("TopoTree drawn to {}", out.display());
            }
            if explore {
                let opts = topo::Explore { model: resolve_model(&model)?, prompt, steps };
                topo::explore(topology.as_deref(), &t, &opts)?;
            }
        }
        Cmd::Eval { model, case, teacher_forced } => {
            let src = std::fs::read_to_string(&case).with_context(|| format!("reading {}", case.display()))?;
            let c: Case = serde_json::from_str(&src).with_context(|| format!("parsing case {}", case.display()))?;
            let (mut engine, tok) = load(&model, 1)?;
            let out = run_case(&mut engine, &tok, &c, teacher_forced)?;
            println!("{}", serde_json::to_string(&out)?);
        }
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn perplexity(m: &ModelArgs, file: &std::path::Path, chunks: Option<usize>, json: bool) -> Result<()> {
    let text = std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?;
    let (mut engine, tok) = load(m, 1)?;
    // As llama-perplexity: BOS added if the model wants it, special-token text not parsed.
    let tokens = tok.encode(&text, true, false)?;
    let bos = if tok.add_bos { tok.bos } else { None };
    if !json {
        eprintln!("{}: {} tokens, chunks of {}", file.display(), tokens.len(), m.ctx_size);
    }
    if let Some(b) = engine.balance() {
        b.reset_stats();
    }
    let r = corelm_engine::perplexity::perplexity(&mut engine, &tokens, bos, m.ctx_size, chunks, |c, p, engine| {
        if !json {
            eprint!("[{}]{p:.4},", c + 1);
        }
        // Online balancing: each chunk's own figures (how the policy follows a text whose
        // activations drift; `scripts/balance_drift.sh`).
        if let Some(b) = engine.balance() {
            eprintln!("\n[chunk {}: {}]", c + 1, sparsity::describe_balance(b));
            b.reset_stats();
        }
    })?;
    if json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        eprintln!();
        println!(
            "Final estimate: PPL = {:.4} +/- {:.5}  ({} chunks of {}, {} tokens scored, {:.1} s, {:.1} tokens/s)",
            r.ppl,
            r.ppl_stderr,
            r.n_chunks,
            r.n_ctx,
            r.tokens_scored,
            r.seconds,
            (r.n_chunks * r.n_ctx) as f64 / r.seconds
        );
    }
    Ok(())
}

/// Interactive chat. Each turn renders the whole conversation with the template and feeds only
/// the text past what the KV cache already holds; if the template does not extend the previous
/// rendering, the sequence is re-prefilled.
fn chat(model: &ModelArgs, sample: &sampling::SampleArgs, system: Option<String>) -> Result<()> {
    let (mut engine, tok) = load(model, 1)?;
    let tmpl = ChatTemplate::from_gguf(engine.gguf(), &tok)?;
    let mut msgs: Vec<Message> = system.iter().map(|s| Message::new("system", s)).collect();
    let mut in_kv = String::new(); // the text whose tokens are in the KV cache
    let params = sampling::gen_params(sample, &tok, engine.config().n_ctx)?;
    let mut draft = sample.draft.load(&engine, &tok)?;
    let stdin = std::io::stdin();
    loop {
        eprint!("> ");
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 {
            break;
        }
        let line = line.trim_end_matches(['\n', '\r']);
        if line.is_empty() {
            continue;
        }
        msgs.push(Message::new("user", line));
        let full = tmpl.render(&msgs, true)?;
        let new_text = match full.strip_prefix(in_kv.as_str()) {
            Some(rest) if !in_kv.is_empty() => rest.to_string(),
            _ => {
                engine.clear_seq(0);
                full.clone()
            }
        };
        let ids = tok.encode(&new_text, engine.seq_len(0) == 0, true)?;
        let g = match generate_drafted(&mut engine, draft.as_mut(), &tok, &ids, &params, print_stream) {
            Ok(g) => g,
            Err(e) => {
                eprintln!("error: {e}");
                msgs.pop();
                engine.clear_seq(0);
                in_kv.clear();
                continue;
            }
        };
        println!();
        in_kv = full + &g.text;
        if g.reason == StopReason::ContextFull {
            eprintln!("[context full: starting over]");
            engine.clear_seq(0);
            in_kv.clear();
        }
        msgs.push(Message::new("assistant", &g.text));
    }
    Ok(())
}
