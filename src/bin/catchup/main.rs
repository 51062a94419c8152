//! The `catchup` command line: offline tools for buffer directories.
//!
//! Exit codes: `0` success; `1` a run-time failure, or `verify` found problems; `2` bad usage
//! or a buffer that cannot be opened (missing, not a buffer, damaged, newer format, in use).

mod demo;
mod dump;
mod exec;
mod inspect;
mod lag;
mod run;
mod schema;
mod serve;
mod sink;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use catchup::store::{Buffer, Snapshot, StoreError};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "catchup",
    version,
    about = "Kafka consumers that do not fall behind after a crash"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Show what a buffer directory holds, per partition and lane (offline, read-only).
    Inspect {
        /// The buffer directory.
        dir: PathBuf,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Where the private copy of the buffer goes (default: the system's temporary
        /// directory); it needs the buffer's size free.
        #[arg(long)]
        tmp_dir: Option<PathBuf>,
    },
    /// Print buffered records as JSON lines, in delivery order (offline, read-only).
    Dump(dump::DumpArgs),
    /// Consume with a catchup consumer into a JSON-lines sink: the reference consumer.
    Run(Box<run::RunArgs>),
    /// Build a backlog, then restart a consumer three ways (off, ordered, concurrent) and compare.
    Demo(demo::DemoArgs),
    /// Check every value, checksum, key and cursor of a buffer (offline, read-only).
    Verify {
        /// The buffer directory.
        dir: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        /// Where the private copy of the buffer goes (default: the system's temporary
        /// directory); it needs the buffer's size free.
        #[arg(long)]
        tmp_dir: Option<PathBuf>,
    },
    /// A group's true progress per partition: during a split, standard lag tools report the
    /// whole backlog; this reads the split tokens and side entries too.
    Lag(lag::LagArgs),
    /// Print a shell completion script, e.g. `catchup completions bash > /etc/bash_completion.d/catchup`.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

/// Why a command failed, and the exit code that says so.
enum Failure {
    /// The buffer cannot be opened, or the arguments are wrong: exit 2.
    Usage(String),
    /// Anything else: exit 1.
    Runtime(String),
}

impl From<StoreError> for Failure {
    fn from(err: StoreError) -> Self {
        match err {
            StoreError::Missing { .. }
            | StoreError::NotABuffer { .. }
            | StoreError::Damaged { .. }
            | StoreError::NewerFormat { .. }
            | StoreError::Locked { .. }
            | StoreError::Options { .. }
            | StoreError::NoRoom { .. }
            | StoreError::Io { .. } => Failure::Usage(err.to_string()),
            other => Failure::Runtime(other.to_string()),
        }
    }
}

/// The exit code class of a library error: a buffer that cannot be opened or a bad
/// setting is usage (2); anything else is a run-time failure (1).
fn failure(err: catchup::Error) -> Failure {
    match err {
        catchup::Error::Store(store) => Failure::from(store),
        catchup::Error::Config(message) => Failure::Usage(message),
        other => Failure::Runtime(other.to_string()),
    }
}

/// Opens a read-only snapshot of `dir`, with a progress bar when copying takes a while.
fn open_snapshot(dir: &Path, tmp_dir: Option<&Path>) -> Result<Snapshot, Failure> {
    let bar = indicatif::ProgressBar::new(0).with_message("copying the buffer");
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg} {bar:30} {bytes}/{total_bytes} ({eta})")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let snapshot = Buffer::open_snapshot_in(dir, tmp_dir, &mut |copied, total| {
        bar.set_length(total);
        bar.set_position(copied);
    });
    bar.finish_and_clear();
    Ok(snapshot?)
}

fn tokio_runtime() -> Result<tokio::runtime::Runtime, Failure> {
    tokio::runtime::Runtime::new()
        .map_err(|e| Failure::Runtime(format!("starting the runtime: {e}")))
}

fn run(cli: Cli) -> Result<ExitCode, Failure> {
    match cli.command {
        Command::Lag(args) => {
            lag::lag(args)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Completions { shell } => {
            use clap::CommandFactory;
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "catchup",
                &mut std::io::stdout(),
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Run(args) => {
            tokio_runtime()?.block_on(run::run(*args))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Demo(args) => {
            tokio_runtime()?.block_on(demo::demo(args))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Inspect { dir, json, tmp_dir } => {
            let snapshot = open_snapshot(&dir, tmp_dir.as_deref())?;
            inspect::print(&dir, snapshot.buffer(), json)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Dump(args) => {
            let snapshot = open_snapshot(&args.dir, args.tmp_dir.as_deref())?;
            dump::print(&args, snapshot.buffer())?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Verify { dir, json, tmp_dir } => {
            let snapshot = open_snapshot(&dir, tmp_dir.as_deref())?;
            let findings = snapshot.buffer().verify()?;
            let report = if json {
                let findings: Vec<_> = findings
                    .iter()
                    .map(|f| serde_json::json!({ "location": f.location, "problem": f.problem }))
                    .collect();
                // A path that is not UTF-8 has no JSON string: shown as `display` shows it.
                let dir = dir.display().to_string();
                serde_json::json!({ "dir": dir, "ok": findings.is_empty(), "findings": findings })
                    .to_string()
            } else if findings.is_empty() {
                format!("ok: {} is sound", dir.display())
            } else {
                let mut lines: Vec<String> = findings.iter().map(ToString::to_string).collect();
                lines.push(format!(
                    "{} finding(s) in {}",
                    findings.len(),
                    dir.display()
                ));
                lines.join("\n")
            };
            print_quietly(&report);
            Ok(if findings.is_empty() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
    }
}

/// Prints `text` and a newline to stdout; a closed pipe (`catchup verify | head -1`) is not
/// an error worth reporting, nor worth a panic.
fn print_quietly(text: &str) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{text}").and_then(|()| out.flush());
}

fn main() -> ExitCode {
    let cli = Cli::parse(); // exits 2 on bad usage, with clap's message
    // Decisions are traced; `RUST_LOG=catchup=info` (or debug) shows them on stderr.
    // Warnings an operator must see (a full disk, a rejected side entry) show by default;
    // sled's own log is left out (its failures reach the user as catchup's errors). RUST_LOG
    // chooses anything else.
    let filter = match std::env::var("RUST_LOG") {
        Ok(directives) if !directives.is_empty() => {
            tracing_subscriber::EnvFilter::builder().parse_lossy(directives)
        }
        _ => tracing_subscriber::EnvFilter::new("warn,sled=off"),
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        // Colour only on a terminal, and never when NO_COLOR is set (no-color.org).
        .with_ansi(
            std::io::IsTerminal::is_terminal(&std::io::stderr())
                && std::env::var_os("NO_COLOR").is_none_or(|value| value.is_empty()),
        )
        .with_writer(std::io::stderr)
        .init();
    // A bug must not print a backtrace at the user: report it as one plain line.
    std::panic::set_hook(Box::new(|_| {}));
    match std::panic::catch_unwind(|| run(cli)) {
        Ok(Ok(code)) => code,
        Ok(Err(Failure::Usage(message))) => {
            eprintln!("catchup: {message}");
            ExitCode::from(2)
        }
        Ok(Err(Failure::Runtime(message))) => {
            eprintln!("catchup: {message}");
            ExitCode::from(1)
        }
        Err(panic) => {
            let message = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("unknown");
            eprintln!("catchup: internal error: {message}");
            ExitCode::from(1)
        }
    }
}
