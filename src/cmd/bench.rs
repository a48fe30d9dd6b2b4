//! `reflex bench bus|loop|learner|kernel|bus-servo|pixels|fleet|rtc|vla`: arguments and what they
//! print.

use crate::cli::{BusArgs, print_json};
use clap::{Args, Subcommand};
use reflex_bench::{
    bus_bench, fleet_bench, kernel_bench, learner_bench, loop_bench, pixels_bench, rtc_bench,
    vla_bench,
};
use reflex_runtime::rt::RtConfig;

#[derive(Subcommand)]
pub enum BenchCommand {
    /// Observation -> command round trip between two processes over Zenoh on loopback.
    Bus(BusBenchArgs),
    /// The control loop's wake-up lateness, misses and per-step overhead.
    Loop(LoopBenchArgs),
    /// SAC update throughput and the wall time of 10k Pendulum steps.
    Learner(LearnerBenchArgs),
    /// The learner's matrix kernel (the same bits on every processor) against the `gemm`
    /// crate, product by product, on one thread.
    Kernel(KernelBenchArgs),
    /// Sync-read and sync-write latency of a whole arm over its emulated servo bus.
    BusServo(crate::cli::ServoBenchArgs),
    /// Each stage of learning from pixels: rendering, the frozen encoder, the actor's image
    /// heads, a learner update.
    Pixels(PixelsBenchArgs),
    /// One learner's ingest and training rates with several actors at once (fleet learning).
    Fleet(FleetBenchArgs),
    /// A chunking policy whose chunks arrive late, per execution mode and delay, on the
    /// simulator: success, jerk and the jump at chunk boundaries (real-time chunking).
    Rtc(RtcBenchArgs),
    /// A SmolVLA-shaped flow VLA (random weights) at its real cost on this CPU: per chunk as two
    /// graphs (prefix once, expert per step) and as one, then the loop at 30 Hz on the simulator
    /// with it on its thread (real-time chunking) and with no policy.
    Vla(VlaBenchArgs),
}

#[derive(Args)]
pub struct VlaBenchArgs {
    /// Loop rate, Hz.
    #[arg(long, default_value_t = 30.0)]
    hz: f64,
    /// Seconds of each loop run.
    #[arg(long, default_value_t = 20.0)]
    seconds: f64,
    /// Chunks timed per way of running it.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    chunks: u64,
    /// Actions executed per chunk of 50.
    #[arg(long, default_value_t = 25)]
    execute: usize,
    /// Flow integration steps (SmolVLA and pi0 take 10).
    #[arg(long, default_value_t = 10)]
    flow_steps: usize,
    /// ONNX Runtime's intra-op threads (one core stays with the loop).
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Where the graphs are written (kept).
    #[arg(long, default_value = "runs/bench-vla")]
    dir: std::path::PathBuf,
    /// The same architecture at a size that runs in moments (a check that the path works, not
    /// a measurement).
    #[arg(long)]
    tiny: bool,
    /// SCHED_FIFO priority for the loop thread (`[loop.rt] fifo_priority`; the VLA's thread does
    /// not take it).
    #[arg(long)]
    fifo: Option<i32>,
    /// Pin the loop thread to this CPU (`[loop.rt] cpu`).
    #[arg(long)]
    cpu: Option<usize>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct RtcBenchArgs {
    /// A diffusion or flow model (its spec beside it).
    #[arg(long, default_value = "models/pick.onnx")]
    model: std::path::PathBuf,
    /// Simulator task the model drives.
    #[arg(long, default_value = "pick")]
    task: String,
    /// The simulator's action space, the one the model was trained in (as `reflex sim demos
    /// --action`): ee-delta, ee-delta-yaw, joint-abs or joint-delta.
    #[arg(long, default_value = "ee-delta")]
    action: String,
    /// Delays in control ticks, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "0,1,2,4,8")]
    delays: Vec<u32>,
    /// Episodes per delay and mode (the same seeds for each).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    episodes: u64,
    /// Seed of the episodes and the policy's noise.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// The RTC modes' weights over the soft part of the overlap (`[policy.rtc]
    /// prefix_attention_schedule`): exp, linear, ones or zeros.
    #[arg(long, default_value = "exp")]
    prefix_attention_schedule: String,
    /// The guided mode's clip on the guidance weight (`[policy.rtc] max_guidance_weight`).
    #[arg(long, default_value_t = 5.0)]
    max_guidance_weight: f32,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct FleetBenchArgs {
    /// Fleet sizes, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8", value_parser = crate::cli::actors)]
    actors: Vec<usize>,
    /// Steps each actor hands over.
    #[arg(long, default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..))]
    steps: u64,
    /// Threads of the learner's matrix products (0: one fewer than the cores, as `reflex learn`).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct PixelsBenchArgs {
    /// The simulated task (reach, push, pick, insert, track).
    #[arg(long, default_value = "pick")]
    task: String,
    /// Camera frame size, WIDTHxHEIGHT (multiples of 4).
    #[arg(long, value_name = "WxH", value_parser = crate::cli::parse_size, default_value = "64x64")]
    size: (u32, u32),
    /// A frozen encoder file (`<model>.encoder.onnx`, written by `bc train --camera`); default:
    /// a fresh one of that shape for the front and wrist cameras.
    #[arg(long, value_name = "FILE")]
    encoder: Option<std::path::PathBuf>,
    /// Environment steps timed.
    #[arg(long, default_value_t = 300)]
    steps: usize,
    /// Learner updates timed.
    #[arg(long, default_value_t = 100)]
    updates: usize,
    /// Learner batch size.
    #[arg(long, default_value_t = 256)]
    batch: usize,
    /// The learner's random shift of the maps, places (`[learner.vision] shift`; default: the
    /// pixel demo's).
    #[arg(long, default_value_t = reflex_demo::VISION_SHIFT as u16, value_parser = clap::value_parser!(u16).range(0..=8))]
    shift: u16,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct SoakArgs {
    /// Control steps, at least: the soak ends with the episode that reaches them (the report
    /// counts every step taken).
    #[arg(long, default_value_t = 1_000_000)]
    steps: u64,
    /// Seed of the faults.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// No faults (the baseline).
    #[arg(long)]
    no_faults: bool,
    /// Where the learner's checkpoints go (default: a temporary directory, removed at the end).
    #[arg(long)]
    dir: Option<std::path::PathBuf>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

pub fn soak(a: SoakArgs) -> anyhow::Result<()> {
    // Without --dir the checkpoints go to a directory of this run's own, removed when it ends or
    // is stopped by a signal (each run left ~40 MB in the temporary directory).
    let (dir, scratch) = match a.dir {
        Some(d) => (d, None),
        None => {
            let s = reflex_bench::scratch::Scratch::new("soak")?;
            (s.path().to_path_buf(), Some(s))
        }
    };
    let o = reflex_bench::soak::SoakOptions {
        steps: a.steps,
        seed: a.seed,
        dir,
        faults: !a.no_faults,
    };
    let v = reflex_bench::soak::run(&o, &crate::cli::Bars::new(a.json));
    drop(scratch);
    let v = v?;
    if a.json {
        print_json(&v);
    } else {
        println!(
            "soak: {} steps in {:.0} s ({:.0} steps/s), per-step work p50 {:.1} us / p99 {:.1} us",
            v.steps, v.wall_s, v.steps_per_s, v.step_p50_us, v.step_p99_us
        );
        println!(
            "  transitions sent {}, persisted {}, lost {}; {} learner restarts, {} NaN chunks, {} hostile messages",
            v.transitions_sent,
            v.transitions_persisted,
            v.transitions_lost,
            v.learner_restarts,
            v.nan_chunks_injected,
            v.hostile_messages
        );
        println!(
            "  resident memory grew {:.1} MB after warm-up; safety: {}",
            v.rss_growth_after_warmup_mb,
            serde_json::to_string(&v.safety)?
        );
    }
    Ok(())
}

#[derive(Args)]
pub struct BusBenchArgs {
    /// Round trips per payload.
    #[arg(long, default_value_t = 5000, value_parser = crate::cli::count)]
    iters: usize,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// Also over TLS with mutual authentication, beside plain TCP in the same run.
    #[arg(long)]
    tls: bool,
    /// Internal: run as the echoing controller, until standard input closes.
    #[arg(long, hide = true)]
    echo: bool,
    #[command(flatten)]
    bus: BusArgs,
}

#[derive(Args)]
pub struct LoopBenchArgs {
    /// Loop rate, Hz.
    #[arg(long, default_value_t = 1000.0, value_parser = crate::cli::hertz)]
    hz: f64,
    /// Seconds to run.
    #[arg(long, default_value_t = 10.0, value_parser = crate::cli::seconds)]
    seconds: f64,
    /// Run one busy thread per CPU beside the loop (inference and learning stand-ins).
    #[arg(long)]
    load: bool,
    /// SCHED_FIFO priority for the loop thread (warns if not permitted).
    #[arg(long)]
    fifo: Option<i32>,
    /// Pin the loop thread to this CPU.
    #[arg(long)]
    cpu: Option<usize>,
    /// Lock memory (mlockall).
    #[arg(long)]
    mlock: bool,
    /// Spin for the last part of each wait, us.
    #[arg(long, default_value_t = 50.0)]
    spin_us: f64,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// Record every step to RUNS/<id>/episodes (to measure the recording's cost on the loop).
    #[arg(long, value_name = "RUNS")]
    record: Option<std::path::PathBuf>,
    /// A file camera beside the loop: a folder of PNG or JPEG frames, decoded and scaled to
    /// 128x128 by its capture thread, the newest handed to every observation.
    #[arg(long, value_name = "DIR")]
    camera: Option<std::path::PathBuf>,
    /// The camera's frame rate.
    #[arg(long, default_value_t = 30.0, value_parser = crate::cli::hertz)]
    camera_fps: f64,
}

#[derive(Args)]
pub struct LearnerBenchArgs {
    /// Updates timed per configuration.
    #[arg(long, default_value_t = 1000)]
    updates: usize,
    /// Environment steps of the Pendulum run (0 skips it).
    #[arg(long, default_value_t = 10_000)]
    pendulum_steps: usize,
    /// Threads the learner's matrix products may use.
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// The matrix kernel's instruction set: avx512, avx2 or portable (default: the processor's
    /// fastest). `--kernel avx2` on an AVX-512 machine times what an AVX2-only one runs.
    #[arg(long, value_parser = learner_bench::KernelPath::parse)]
    kernel: Option<learner_bench::KernelPath>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct KernelBenchArgs {
    /// Timed repetitions of each product.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..))]
    reps: u64,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(cmd: BenchCommand) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::Bus(a) if a.echo => bus_bench::echo(&a.bus.config())?,
        BenchCommand::Bus(a) => bus(a)?,
        BenchCommand::BusServo(a) => crate::cli::servo_bench(&a)?,
        BenchCommand::Pixels(a) => pixels(a)?,
        BenchCommand::Loop(a) => loop_bench(a)?,
        BenchCommand::Fleet(a) => fleet(a)?,
        BenchCommand::Rtc(a) => rtc(a)?,
        BenchCommand::Vla(a) => vla(a)?,
        BenchCommand::Kernel(a) => kernel(a)?,
        BenchCommand::Learner(a) => learner(a)?,
    }
    Ok(())
}

fn bus(a: BusBenchArgs) -> anyhow::Result<()> {
    let out = bus_bench::run(a.iters, a.bus.listen.first().cloned(), a.tls)?;
    if a.json {
        print_json(&out);
        return Ok(());
    }
    let runs = match &out {
        bus_bench::BusBenchReport::One(r) => vec![r],
        bus_bench::BusBenchReport::Both { tcp, tls } => vec![tcp, tls],
    };
    for run in runs {
        println!(
            "bus round trip obs -> cmd between two processes over {}:",
            run.transport
        );
        for (key, v) in run.rows() {
            println!(
                "  {key:>20} ({:>5} B): p50 {:>4.0} us, p99 {:>4.0} us, max {:>5.0} us over {} round trips",
                v.bytes, v.p50_us, v.p99_us, v.max_us, v.iters
            );
        }
    }
    Ok(())
}

fn pixels(a: PixelsBenchArgs) -> anyhow::Result<()> {
    let task = a
        .task
        .parse()
        .map_err(|e: reflex_sim::task::UnknownTask| anyhow::anyhow!("--task: {e}"))?;
    let o = pixels_bench::PixelsBenchOptions {
        task,
        width: a.size.0,
        height: a.size.1,
        encoder: a.encoder,
        steps: a.steps,
        updates: a.updates,
        batch: a.batch,
        shift: a.shift.into(),
    };
    let r = pixels_bench::run(&o)?;
    if a.json {
        print_json(&r);
    } else {
        println!(
            "pixels on `{}`, cameras {:?} at {}x{}, encoder {} ({} feature values a step):",
            r.task, r.cameras, r.width, r.height, r.encoder, r.features
        );
        for (name, s) in [
            ("sim step with cameras", &r.sim_cameras),
            ("sim step without", &r.sim_no_cameras),
            ("encoder (all cameras)", &r.encode),
            ("actor with image heads", &r.actor),
            ("learner update", &r.update),
        ] {
            println!(
                "  {name:<24} p50 {:>9.1} us  p99 {:>9.1} us",
                s.p50_us, s.p99_us
            );
        }
        println!(
            "  {:.0} frames/s rendered, encoded and acted on; {:.1} steps/s with one update (batch {}, maps shifted by up to {}) each; {:.0} s",
            r.frames_per_s, r.steps_per_s_with_updates, r.batch, r.shift, r.wall_s
        );
    }
    Ok(())
}

fn loop_bench(a: LoopBenchArgs) -> anyhow::Result<()> {
    let o = loop_bench::LoopBenchOptions {
        hz: a.hz,
        seconds: a.seconds,
        load: a.load,
        rt: RtConfig {
            fifo_priority: a.fifo,
            cpu: a.cpu,
            mlockall: a.mlock,
        },
        spin_us: a.spin_us,
        record: a.record,
        camera: a.camera.map(|dir| loop_bench::CameraBeside {
            dir,
            fps: a.camera_fps,
            resize: [128, 128],
        }),
    };
    let out = loop_bench::run(&o)?;
    if a.json {
        print_json(&out);
    } else {
        print_loop(&out, &o);
    }
    Ok(())
}

fn fleet(a: FleetBenchArgs) -> anyhow::Result<()> {
    let scratch = reflex_bench::scratch::Scratch::new("bench-fleet")?;
    let o = fleet_bench::FleetBenchOptions {
        actors: a.actors,
        steps_per_actor: a.steps,
        threads: a.threads,
        dir: scratch.path().to_path_buf(),
    };
    let out = fleet_bench::run(&o);
    drop(scratch);
    let out = out?;
    if a.json {
        print_json(&out);
    } else {
        println!("{} ({} threads)", out.learner, out.threads);
        for p in &out.points {
            println!(
                "{:>2} actors: {:>7.0} steps/s ingested, {:>7.0} trained on ({} shed), {:>7.0} updates/s: {:.1} robots at 20 Hz",
                p.actors,
                p.steps_per_s,
                p.trained_steps_per_s,
                p.updates_shed,
                p.updates_per_s,
                p.robots_at_20hz
            );
        }
    }
    Ok(())
}

fn rtc(a: RtcBenchArgs) -> anyhow::Result<()> {
    let task = a
        .task
        .parse()
        .map_err(|e: reflex_sim::task::UnknownTask| anyhow::anyhow!("--task: {e}"))?;
    let mut modes = vec![
        rtc_bench::ExecMode::Sync,
        rtc_bench::ExecMode::Naive,
        rtc_bench::ExecMode::Ensemble,
        rtc_bench::ExecMode::RtcHard,
    ];
    // The paper's method where the model carries its VJP graph (a flow policy).
    if reflex_policies::spec::PolicySpec::load_for(&a.model)?
        .graph
        .vjp
        .is_some()
    {
        modes.push(rtc_bench::ExecMode::RtcGuided);
    }
    let action = serde_json::from_value(serde_json::Value::String(a.action.replace('-', "_")))
        .map_err(|_| {
            anyhow::anyhow!(
                "--action {}: one of ee-delta, ee-delta-yaw, joint-abs, joint-delta",
                a.action
            )
        })?;
    let o = rtc_bench::RtcBenchOptions {
        model: a.model,
        task,
        action,
        delays: a.delays,
        modes,
        episodes: a.episodes,
        seed: a.seed,
        rtc: reflex_policies::rtc::RtcConfig {
            prefix_attention_schedule: serde_json::from_value(serde_json::Value::String(
                a.prefix_attention_schedule.clone(),
            ))
            .map_err(|_| {
                anyhow::anyhow!(
                    "--prefix-attention-schedule {}: one of exp, linear, ones, zeros",
                    a.prefix_attention_schedule
                )
            })?,
            max_guidance_weight: a.max_guidance_weight,
            ..Default::default()
        },
    };
    let json = a.json;
    let out = rtc_bench::run(&o, &mut |c| {
        if !json {
            println!(
                "delay {:>2} ticks {:<9} success {:>5.1}% [{:.0}-{:.0}]  {:.1} steps  jerk mean {:.4} p99 {:.4}  boundary jump {:.4} (other ticks {:.4})  holds {}",
                c.delay_ticks,
                format!("{:?}", c.mode),
                100.0 * c.success_rate,
                100.0 * c.success_ci95.0,
                100.0 * c.success_ci95.1,
                c.mean_steps,
                c.jerk_mean,
                c.jerk_p99,
                c.boundary_jump_mean,
                c.step_change_mean,
                c.holds_no_chunk
            );
        }
    })
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    if json {
        print_json(&out);
    } else {
        for n in &out.not_measured {
            println!("not measured: {n}");
        }
    }
    Ok(())
}

fn vla(a: VlaBenchArgs) -> anyhow::Result<()> {
    let o = vla_bench::VlaBenchOptions {
        hz: a.hz,
        seconds: a.seconds,
        chunks: a.chunks as usize,
        execute: a.execute,
        flow_steps: a.flow_steps,
        threads: a.threads,
        dir: a.dir,
        tiny: a.tiny,
        rt: RtConfig {
            fifo_priority: a.fifo,
            cpu: a.cpu,
            mlockall: false,
        },
    };
    let json = a.json;
    let out = vla_bench::run(&o, &mut |m| eprintln!("{m}"))?;
    if json {
        print_json(&out);
        return Ok(());
    }
    println!(
        "SmolVLA-shaped flow VLA, random weights: prefix {:.1} M weights, expert {:.1} M, {} steps, {} thread(s)",
        out.prefix_params_m, out.expert_params_m, out.flow_steps, out.threads
    );
    let t = &out.two_graphs;
    println!(
        "two graphs: chunk p50 {:.1} ms p99 {:.1} ms (prefix {:.1} ms + expert {:.1} ms)",
        t.p50_us / 1e3,
        t.p99_us / 1e3,
        t.prefix_p50_us.unwrap_or(f64::NAN) / 1e3,
        t.expert_p50_us.unwrap_or(f64::NAN) / 1e3
    );
    println!(
        "one graph:  chunk p50 {:.1} ms p99 {:.1} ms ({:.1}x the two graphs; chunks differ by at most {:.1e})",
        out.single_graph.p50_us / 1e3,
        out.single_graph.p99_us / 1e3,
        out.single_over_two,
        out.max_abs_diff
    );
    println!(
        "loop at {} Hz, execute {} of 50, delay {} ticks{}:",
        out.hz,
        out.execute,
        out.delay_ticks,
        if out.rt.is_empty() {
            String::new()
        } else {
            format!(" ({})", out.rt.join("; "))
        }
    );
    for r in [&out.with_vla, &out.without_policy] {
        println!(
            "  {:<22} {} ticks, lateness p50 {:.0} us p99 {:.0} us max {:.0} us, missed {}, holds {} ({} episodes ended), chunks {}{}",
            r.policy,
            r.ticks,
            r.lateness_p50_us,
            r.lateness_p99_us,
            r.lateness_max_us,
            r.missed,
            r.holds_no_chunk,
            r.episodes,
            r.chunks,
            r.rtc.map(|v| format!(", rtc {v:?}")).unwrap_or_default()
        );
    }
    Ok(())
}

fn kernel(a: KernelBenchArgs) -> anyhow::Result<()> {
    let out = kernel_bench::run(a.reps as usize);
    if a.json {
        print_json(&out);
    } else {
        println!("kernel path: {} ({} reps, medians)", out.path, out.reps);
        for t in &out.shapes {
            println!(
                "{:<52} kernel {:>8.1} us ({:>5.1} GFLOP/s), gemm {:>8.1} us: {:.2}x",
                t.shape.what, t.kernel_p50_us, t.kernel_gflop_per_s, t.gemm_p50_us, t.speedup
            );
        }
    }
    Ok(())
}

fn learner(a: LearnerBenchArgs) -> anyhow::Result<()> {
    let out = learner_bench::run(a.updates, a.pendulum_steps, a.threads, a.kernel)?;
    if a.json {
        print_json(&out);
    } else {
        println!("kernel path: {}, {} thread(s)", out.kernel, out.threads);
        for (name, r) in out.rates() {
            println!("{name:<26} {:>8.1} updates/s", r.updates_per_s);
        }
        if let Some(p) = &out.pendulum {
            println!(
                "pendulum {} steps (64x64, batch 100, 1 update/step): {:.1} s, final return {:.0}",
                p.steps, p.wall_s, p.final_return
            );
        }
    }
    Ok(())
}

fn print_loop(out: &loop_bench::LoopBenchReport, o: &loop_bench::LoopBenchOptions) {
    println!(
        "loop at {} Hz for {:.1} s{}: {} ticks ({:.1} Hz achieved)",
        o.hz,
        out.seconds,
        if o.load {
            format!(" with {} busy threads", out.load_threads)
        } else {
            String::new()
        },
        out.ticks,
        out.rate_hz
    );
    println!(
        "  wake-up lateness: p50 {:.1} us, p99 {:.1} us, max {:.1} us; missed {}, overruns {}",
        out.lateness_p50_us, out.lateness_p99_us, out.lateness_max_us, out.missed, out.overruns
    );
    println!(
        "  per-step work (observe, chunks, residual, safety, command): p50 {:.2} us, p99 {:.2} us, mean {:.2} us",
        out.step_p50_us, out.step_p99_us, out.step_mean_us
    );
    println!(
        "  chunks received {}, holds for want of a chunk {}",
        out.chunks, out.holds_no_chunk
    );
    if let Some(c) = &out.camera {
        println!(
            "  camera beside: {} frames at {:.1} fps, {} handed on, {} replaced unseen, {} errors",
            c.frames, c.fps, c.used, c.skipped, c.errors
        );
    }
}
