//! Command line: `serve` (default) | `migrate` | `budgets` | `lookup IP` | `ranges update` |
//! `issue-token`.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};

mod policy;
mod remote;

use crate::access::Role;
use crate::app::App;
use crate::config::Settings;
use crate::store::Durable;

/// Palisade: abuse signals, reputation and layered rate limits for mobile backends.
#[derive(Debug, Parser)]
#[command(name = "palisade", version, about)]
pub struct Args {
    /// Settings file (TOML). Default: `palisade.toml` if present.
    #[arg(long, global = true, env = "PALISADE_CONFIG")]
    pub config: Option<PathBuf>,
    /// What to do (default: serve).
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// `palisade policy …`.
#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Report a candidate file's errors, dead rules and changes (exit 1 on an error).
    Check {
        /// The candidate settings file.
        file: PathBuf,
        /// Print the findings as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Suggest budgets from the recorded traffic (`[record]`): each budget's per-key
    /// distribution over the clients the engine did not flag, a candidate `[limits]` that
    /// keeps `--honest` percent of them under every budget, and its replay against the live
    /// policy (Markdown, or JSON with `--json`).
    Suggest {
        /// From this RFC 3339 time (default: the oldest recorded check).
        #[arg(long)]
        from: Option<String>,
        /// Before this RFC 3339 time (default: now).
        #[arg(long)]
        to: Option<String>,
        /// Percent of honest keys each budget keeps under it per period.
        #[arg(long, default_value_t = 99.9)]
        honest: f64,
        /// The honest quantile is multiplied by this before rounding to a readable number.
        #[arg(long, default_value_t = 1.25)]
        headroom: f64,
        /// Write the candidate settings file (its whole `[limits]`) here.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Print the proposal as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Sub-commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the HTTP API (the default).
    Serve,
    /// Apply database migrations and exit.
    Migrate,
    /// Print every effective budget and class as Markdown tables.
    Budgets,
    /// Check a candidate settings file: errors with line and column, unreachable class
    /// patterns, budgets that never apply, and its `[limits]` against the live one.
    Policy {
        /// What to do with the policy.
        #[command(subcommand)]
        action: PolicyCommand,
    },
    /// Replay the recorded traffic (`[record]`) through the live `[limits]` and a
    /// candidate's, and report what would change (Markdown, or JSON with `--json`).
    Replay {
        /// A settings file whose `[limits]` is the candidate (other sections are ignored).
        #[arg(long)]
        policy: PathBuf,
        /// From this RFC 3339 time (default: the oldest recorded check).
        #[arg(long)]
        from: Option<String>,
        /// Before this RFC 3339 time (default: now).
        #[arg(long)]
        to: Option<String>,
        /// How scoring is modelled: `recorded` (each check's multipliers as the live
        /// limiter applied them) or `one` (every multiplier held at 1).
        #[arg(long, default_value = "recorded")]
        signals: String,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Print the reputation of one IP from the data dir (offline), as JSON.
    Lookup {
        /// IPv4 or IPv6 address.
        ip: std::net::IpAddr,
    },
    /// Manage range sources.
    Ranges {
        /// What to do with range sources.
        #[command(subcommand)]
        action: RangesCommand,
    },
    /// Ask a running instance's `/readyz` (the container's and systemd's health check):
    /// exit 0 when ready, 1 otherwise.
    Health {
        /// Base URL of the instance; default: the configured `listen` address.
        #[arg(long)]
        url: Option<String>,
    },
    /// Lockouts of a running instance (`--url`, `--token` of an analyst).
    Lockouts {
        /// The instance.
        #[command(flatten)]
        remote: remote::Remote,
        /// What to do.
        #[command(subcommand)]
        action: remote::LockoutsCommand,
    },
    /// Allow and deny lists of a running instance (`--url`, `--token` of an admin).
    Lists {
        /// The instance.
        #[command(flatten)]
        remote: remote::Remote,
        /// What to do.
        #[command(subcommand)]
        action: remote::ListsCommand,
    },
    /// Runtime overrides of a running instance (`--url`, `--token` of an admin; listing
    /// needs an analyst).
    Overrides {
        /// The instance.
        #[command(flatten)]
        remote: remote::Remote,
        /// What to do.
        #[command(subcommand)]
        action: remote::OverridesCommand,
    },
    /// A running instance's edge rules for a CDN (`--url`, `--token` of an admin):
    /// `cloudflare`, `aws-waf` or `fastly`, to stdout or `--out FILE`.
    Export {
        /// The instance.
        #[command(flatten)]
        remote: remote::Remote,
        /// `cloudflare`, `aws-waf` or `fastly`.
        provider: String,
        /// Write to this file instead of stdout.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// API tokens of a running instance (`--url`, `--token` of an admin).
    Tokens {
        /// The instance.
        #[command(flatten)]
        remote: remote::Remote,
        /// What to do.
        #[command(subcommand)]
        action: remote::TokensCommand,
    },
    /// Signed identities (`forward_auth.identity_secret`).
    Identity {
        /// What to do.
        #[command(subcommand)]
        action: IdentityCommand,
    },
    /// Create an API token in the configured database and print it once (stored hashed):
    /// before any admin token exists, or after every one is lost. `palisade tokens` manages
    /// the tokens of a running instance.
    IssueToken {
        /// ingest | limiter | analyst | admin
        #[arg(long, value_parser = parse_role)]
        role: Role,
        /// A name unique among active tokens.
        #[arg(long)]
        name: String,
        /// Why (kept in the audit log).
        #[arg(long, default_value = "created with the palisade command line")]
        reason: String,
    },
}

/// `palisade identity …`.
#[derive(Debug, Subcommand)]
pub enum IdentityCommand {
    /// Print an `X-Palisade-Identity` value signed with the first configured secret (for
    /// tests and gateways' scripts).
    Sign {
        /// The user id.
        #[arg(long)]
        uid: Option<String>,
        /// The device id.
        #[arg(long)]
        did: Option<String>,
        /// The tenant (makes a v2 identity).
        #[arg(long)]
        tid: Option<String>,
        /// Seconds it stays valid.
        #[arg(long, default_value_t = 60)]
        ttl: i64,
    },
}

/// `palisade ranges …`.
#[derive(Debug, Subcommand)]
pub enum RangesCommand {
    /// Download the sources of `[[reputation.sources]]` into the data dir (atomically; a
    /// failed source keeps its previous file). Then reload: SIGHUP or POST /v1/admin/reload.
    Update {
        /// Give up on a download that sends nothing for this many seconds (a slow but
        /// moving download is never cut).
        #[arg(long, default_value_t = 30)]
        idle_timeout: u64,
    },
}

fn parse_role(value: &str) -> Result<Role, String> {
    Role::parse(value).ok_or_else(|| {
        format!("{value:?} is not a role (expected ingest, limiter, analyst or admin)")
    })
}

/// Parses the command line and runs it. Settings errors exit with status 2 and one line.
pub fn run() -> ExitCode {
    let args = Args::parse();
    let settings = match Settings::load(args.config.as_deref()) {
        Ok(settings) => settings,
        Err(err) => {
            eprintln!("palisade: {err}");
            return ExitCode::from(2);
        }
    };
    crate::telemetry::init(settings.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(settings.http.worker_count())
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("palisade: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(execute(args.command.unwrap_or(Command::Serve), settings)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("palisade: {err:#}");
            ExitCode::FAILURE
        }
    }
}

async fn execute(command: Command, settings: Settings) -> anyhow::Result<()> {
    match command {
        Command::Serve => serve(settings).await,
        Command::Health { url } => health(&settings, url).await,
        Command::Lockouts { remote, action } => remote::lockouts(&remote, action).await,
        Command::Lists { remote, action } => remote::lists(&remote, action).await,
        Command::Tokens { remote, action } => remote::tokens(&remote, action).await,
        Command::Overrides { remote, action } => remote::overrides(&remote, action).await,
        Command::Export {
            remote,
            provider,
            out,
        } => remote::export(&remote, &provider, out.as_deref()).await,
        Command::Identity {
            action: IdentityCommand::Sign { uid, did, tid, ttl },
        } => {
            let secret = settings.forward_auth.identity_secret.first().context(
                "set PALISADE_FORWARD_AUTH__IDENTITY_SECRET (forward_auth.identity_secret) first",
            )?;
            let now_s = crate::clock::Clock::now_ms(&crate::clock::SystemClock::new()) / 1000;
            let exp = now_s.saturating_add(ttl.max(1));
            println!(
                "{}",
                crate::access::identity::sign(
                    secret,
                    exp,
                    uid.as_deref(),
                    did.as_deref(),
                    tid.as_deref()
                )
            );
            Ok(())
        }
        Command::Budgets => {
            print!(
                "{}",
                crate::limiter::Budgets::from_settings(&settings.limits).markdown()
            );
            Ok(())
        }
        Command::Lookup { ip } => {
            let reputation = crate::reputation::Reputation::open(
                &settings.data_dir,
                settings.reputation.clone(),
                std::sync::Arc::new(crate::clock::SystemClock::new()),
            )
            .context("PALISADE_DATA_DIR")?;
            println!("{}", serde_json::to_string_pretty(&reputation.lookup(ip))?);
            Ok(())
        }
        Command::Ranges {
            action: RangesCommand::Update { idle_timeout },
        } => {
            let results = crate::reputation::update::update(
                &settings.data_dir,
                &settings.reputation.sources,
                std::time::Duration::from_secs(idle_timeout.max(1)),
            )
            .await;
            let mut failed = 0;
            for (file, result) in results {
                match result {
                    Ok(ranges) => println!("updated {file}: {ranges} ranges"),
                    Err(reason) => {
                        failed += 1;
                        eprintln!("palisade: {file} not updated: {reason}");
                    }
                }
            }
            if failed > 0 {
                anyhow::bail!("{failed} source(s) not updated");
            }
            Ok(())
        }
        Command::Policy {
            action: PolicyCommand::Check { file, json },
        } => policy::policy_check(&settings, &file, json).await,
        Command::Policy {
            action:
                PolicyCommand::Suggest {
                    from,
                    to,
                    honest,
                    headroom,
                    out,
                    json,
                },
        } => {
            policy::suggest(
                &settings,
                policy::SuggestArgs {
                    window: (from.as_deref(), to.as_deref()),
                    options: crate::policy::suggest::Options { honest, headroom },
                    out: out.as_deref(),
                    json,
                },
            )
            .await
        }
        Command::Replay {
            policy,
            from,
            to,
            signals,
            json,
        } => {
            policy::replay(
                &settings,
                &policy,
                (from.as_deref(), to.as_deref()),
                &signals,
                json,
            )
            .await
        }
        Command::Migrate => {
            let durable = Durable::connect(
                &settings.database_url,
                1,
                std::time::Duration::from_millis(settings.store.db_timeout_ms),
            )
            .await
            .context("cannot connect to PALISADE_DATABASE_URL")?;
            durable.migrate().await.context("migrations failed")?;
            println!("migrations applied ({})", durable.kind());
            Ok(())
        }
        Command::IssueToken { role, name, reason } => {
            let store = stored_in(&settings.database_url);
            let app = App::build(settings)
                .await
                .context("cannot open the stores")?;
            let issued = app.access.create(role, &name, "cli").await?;
            let actor = crate::audit::Actor {
                id: "cli".to_owned(),
                name: "cli".to_owned(),
                role: "admin".to_owned(),
            };
            app.audit
                .record(
                    &actor,
                    "token.create",
                    &issued.info.id,
                    serde_json::json!({ "name": issued.info.name, "role": issued.info.role, "reason": reason }),
                    "cli",
                )
                .await?;
            println!(
                "id:    {}\nrole:  {}\ntoken: {}\nstore: {store}",
                issued.info.id,
                role.as_str(),
                issued.secret
            );
            Ok(())
        }
    }
}

/// Where a durable store URL points, said so that no one mistakes it: a SQLite file as its
/// absolute path (run in another folder, `sqlite://palisade.db` is another database), any
/// other URL without its password.
fn stored_in(database_url: &str) -> String {
    match database_url.strip_prefix("sqlite://") {
        Some(path) => {
            let path = path.split('?').next().unwrap_or(path);
            let absolute = std::path::Path::new(path);
            let absolute = if absolute.is_absolute() {
                absolute.to_path_buf()
            } else {
                std::env::current_dir()
                    .map(|dir| dir.join(absolute))
                    .unwrap_or_else(|_| absolute.to_path_buf())
            };
            format!("sqlite://{}", absolute.display())
        }
        None => crate::config::redact_url(database_url),
    }
}

async fn serve(settings: Settings) -> anyhow::Result<()> {
    let listen = settings.listen;
    let grpc_listen = settings.grpc_listen_addr().unwrap_or_default();
    let app = App::build(settings)
        .await
        .context("cannot open the stores")?;
    tracing::info!(
        durable = app.stores.durable.kind(),
        hot = app.stores.hot.kind(),
        "stores ready"
    );
    let listener = crate::api::bind(listen, app.settings.http.listen_backlog)
        .with_context(|| format!("cannot listen on {listen} (PALISADE_LISTEN)"))?;
    tracing::info!("listening on http://{listen}");
    let grpc = match grpc_listen {
        Some(address) => Some(
            tokio::net::TcpListener::bind(address)
                .await
                .with_context(|| format!("cannot listen on {address} (PALISADE_GRPC_LISTEN)"))?,
        ),
        None => None,
    };
    let state = app.into_state();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    App::spawn_background(&state, stopped.clone());
    spawn_sighup_reload(&state);
    if let Some(listener) = grpc {
        tracing::info!(
            "Envoy rate limit service (gRPC) on {}",
            listener.local_addr()?
        );
        let state = state.clone();
        let mut stopped = stopped;
        tokio::spawn(async move {
            let shutdown = async move {
                let _ = stopped.wait_for(|stop| *stop).await;
            };
            if let Err(err) = crate::api::envoy::serve(state, listener, shutdown).await {
                tracing::error!(error.cause = %err, "the gRPC server stopped: {err}");
            }
        });
    }
    crate::api::serve(state, listener, shutdown_signal()).await?;
    let _ = stop.send(true);
    tracing::info!("shut down");
    Ok(())
}

/// SIGHUP re-reads the data dir (like `POST /v1/admin/reload`); a broken file is logged and
/// the old data stays.
fn spawn_sighup_reload(state: &crate::app::AppState) {
    #[cfg(unix)]
    {
        let state = state.clone();
        tokio::spawn(async move {
            let Ok(mut hangup) =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
            else {
                return;
            };
            while hangup.recv().await.is_some() {
                let reloaded = state.reputation.reload().await;
                state.scoring.invalidate();
                if let Err(err) = reloaded {
                    tracing::error!(error.cause = %err, "SIGHUP reload rejected; keeping the old data: {err}");
                }
            }
        });
    }
    #[cfg(not(unix))]
    let _ = state;
}

/// Completes on ctrl-c or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
    tracing::info!("shutdown requested; draining requests");
}

/// `palisade health`: `GET /readyz` of a running instance within 3 s.
async fn health(settings: &Settings, url: Option<String>) -> anyhow::Result<()> {
    let base = url.unwrap_or_else(|| {
        let mut listen = settings.listen;
        // A wildcard listener is asked on loopback.
        if listen.ip().is_unspecified() {
            listen.set_ip(if listen.is_ipv4() {
                std::net::Ipv4Addr::LOCALHOST.into()
            } else {
                std::net::Ipv6Addr::LOCALHOST.into()
            });
        }
        format!("http://{listen}")
    });
    let url = format!("{}/readyz", base.trim_end_matches('/'));
    let response = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(3))
        .build()?
        .get(&url)
        .send()
        .await
        .with_context(|| format!("GET {url}"))?;
    let status = response.status();
    let body = response.text().await.unwrap_or_default();
    if status.is_success() {
        println!("ready: {body}");
        Ok(())
    } else {
        anyhow::bail!("{url} answered {status}: {body}")
    }
}
