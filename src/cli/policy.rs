//! The policy tools beside the service: `policy check`, `policy suggest` and `replay`, each
//! against the live `[limits]` (the promoted policy's when the database holds one).

use anyhow::Context;

use crate::config::Settings;
use crate::store::Durable;

/// An optional `--NAME` RFC 3339 time as Unix ms.
fn rfc3339_ms(name: &str, value: Option<&str>) -> anyhow::Result<Option<i64>> {
    value
        .map(|text| {
            chrono::DateTime::parse_from_rfc3339(text)
                .map(|t| t.timestamp_millis())
                .with_context(|| format!("--{name} must be an RFC 3339 time"))
        })
        .transpose()
}

/// The live `[limits]` for a tool beside the service: the promoted policy's when the
/// database holds one, else the settings file's; with a line saying which. The database
/// out of reach leaves the settings file's, and says so.
pub(super) async fn live_limits(settings: &Settings) -> (crate::config::LimitSettings, String) {
    let durable =
        Durable::connect(&settings.database_url, 1, std::time::Duration::from_secs(3)).await;
    live_limits_in(settings, durable.as_ref().map_err(|err| err.to_string())).await
}

/// [`live_limits`] with the database already open (or why it is not).
async fn live_limits_in(
    settings: &Settings,
    durable: Result<&Durable, String>,
) -> (crate::config::LimitSettings, String) {
    let stored = match durable {
        Ok(durable) => crate::policy::canary::stored_live_limits(durable, &settings.limits)
            .await
            .map_err(|err| err.to_string()),
        Err(err) => Err(err),
    };
    match stored {
        Ok((limits, Some(id))) => (limits, format!("the live [limits] (promoted policy {id})")),
        Ok((limits, None)) => (limits, "the live [limits] (the settings file's)".to_owned()),
        Err(err) => (
            settings.limits.clone(),
            format!("the settings file's [limits] (the database does not say what is live: {err})"),
        ),
    }
}

/// What a tool reading the record works on: the window (`--from`, `--to`), the database,
/// and the live `[limits]` with the line saying where they come from.
struct OnRecord {
    from_ms: i64,
    to_ms: i64,
    durable: Durable,
    live: crate::config::LimitSettings,
    against: String,
}

impl OnRecord {
    async fn open(
        settings: &Settings,
        window: (Option<&str>, Option<&str>),
    ) -> anyhow::Result<Self> {
        let from_ms = rfc3339_ms("from", window.0)?.unwrap_or(i64::MIN);
        let to_ms = rfc3339_ms("to", window.1)?.unwrap_or(i64::MAX);
        let durable = Durable::connect(
            &settings.database_url,
            1,
            std::time::Duration::from_secs(60),
        )
        .await
        .context("cannot connect to PALISADE_DATABASE_URL")?;
        let (live, against) = live_limits_in(settings, Ok(&durable)).await;
        Ok(Self {
            from_ms,
            to_ms,
            durable,
            live,
            against,
        })
    }
}

/// `palisade replay`: pages through the record in order and reports.
pub(super) async fn replay(
    settings: &Settings,
    policy: &std::path::Path,
    window: (Option<&str>, Option<&str>),
    signals: &str,
    json: bool,
) -> anyhow::Result<()> {
    use std::io::IsTerminal;

    let candidate = Settings::candidate(policy).map_err(|err| anyhow::anyhow!("{err}"))?;
    let signals = crate::policy::replay::Signals::parse(signals)
        .context("--signals must be `recorded` or `one`")?;
    let OnRecord {
        from_ms,
        to_ms,
        durable,
        live,
        against,
    } = OnRecord::open(settings, window).await?;
    let progress = std::io::stderr().is_terminal();
    let mut report = crate::policy::replay::replay_window(
        &durable,
        (&live, &candidate.limits),
        crate::policy::replay::Window {
            from_ms,
            to_ms,
            max: usize::MAX,
        },
        signals,
        None,
        |report, at_ms| {
            if progress {
                eprint!(
                    "\rreplayed {} checks, up to {}",
                    report.requests,
                    crate::clock::rfc3339(at_ms)
                );
            }
        },
    )
    .await?;
    if progress && report.requests > 0 {
        eprintln!();
    }
    if report.requests == 0 {
        let now = chrono::Utc::now().timestamp_millis();
        report.empty = Some(crate::policy::record::why_empty(
            &settings.record,
            from_ms,
            now,
        ));
    }
    if !json {
        println!("Compared with {against}.\n");
    }
    // The logins of the window through both `[lockout]`s, when any were stored.
    let events = crate::policy::logins::read(&durable, from_ms, to_ms, 2_000_000).await?;
    let logins = if events.is_empty() {
        None
    } else {
        Some(crate::login_replay::replay(settings, &candidate.lockout, &events).await?)
    };
    if json {
        let mut value = serde_json::to_value(&report)?;
        value["logins"] = serde_json::to_value(&logins)?;
        println!("{}", serde_json::to_string_pretty(&value)?);
    } else {
        print!("{}", report.markdown());
        if let Some(l) = &logins {
            println!(
                "\n| logins | live | candidate |\n|---|---:|---:|\n| accounts locked | {} | {} |\n| successful logins it would have refused | {} | {} |",
                l.locked_live,
                l.locked_candidate,
                l.successes_refused_live,
                l.successes_refused_candidate
            );
            if !l.newly_locked.is_empty() {
                println!("\nNewly locked: {}", l.newly_locked.join(", "));
            }
            if !l.no_longer_locked.is_empty() {
                println!("\nNo longer locked: {}", l.no_longer_locked.join(", "));
            }
        }
    }
    Ok(())
}

/// `palisade policy check FILE`: findings as `FILE:LINE:COL: level: message` lines.
pub(super) async fn policy_check(
    settings: &Settings,
    file: &std::path::Path,
    json: bool,
) -> anyhow::Result<()> {
    use crate::policy::check::{Level, check};

    let text =
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    let (live, against) = live_limits(settings).await;
    let findings = check(&text, &live);
    if json {
        println!("{}", serde_json::to_string_pretty(&findings)?);
    } else {
        for f in &findings {
            let at = match (f.line, f.column) {
                (Some(line), Some(column)) => format!("{}:{line}:{column}", file.display()),
                _ => file.display().to_string(),
            };
            let level = match f.level {
                Level::Error => "error",
                Level::Warning => "warning",
                Level::Change => "change",
            };
            println!("{at}: {level}: {}", f.message);
        }
        let count = |l: Level| findings.iter().filter(|f| f.level == l).count();
        println!(
            "{} error(s), {} warning(s), {} change(s) against {against}",
            count(Level::Error),
            count(Level::Warning),
            count(Level::Change)
        );
    }
    if findings.iter().any(|f| f.level == Level::Error) {
        anyhow::bail!("{} has errors", file.display());
    }
    Ok(())
}

/// What `palisade policy suggest` is asked.
pub(super) struct SuggestArgs<'a> {
    pub window: (Option<&'a str>, Option<&'a str>),
    pub options: crate::policy::suggest::Options,
    pub out: Option<&'a std::path::Path>,
    pub json: bool,
}

/// `palisade policy suggest`: budgets from the record, replayed against the live policy.
pub(super) async fn suggest(settings: &Settings, args: SuggestArgs<'_>) -> anyhow::Result<()> {
    args.options
        .validate()
        .map_err(|err| anyhow::anyhow!("{err}"))?;
    let OnRecord {
        from_ms,
        to_ms,
        durable,
        live,
        against,
    } = OnRecord::open(settings, args.window).await?;
    let mut proposal = crate::policy::suggest::propose(
        &durable,
        (settings, &live),
        (from_ms, to_ms),
        args.options,
        usize::MAX,
    )
    .await?;
    if proposal.suggestion.records == 0 {
        let now = chrono::Utc::now().timestamp_millis();
        proposal.empty = Some(crate::policy::record::why_empty(
            &settings.record,
            from_ms,
            now,
        ));
    }
    if let Some(out) = args.out
        && proposal.empty.is_none()
    {
        std::fs::write(out, &proposal.suggestion.toml)
            .with_context(|| format!("cannot write {}", out.display()))?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&proposal)?);
    } else {
        println!("Compared with {against}.\n");
        print!("{}", proposal.markdown());
        match args.out {
            Some(out) if proposal.empty.is_none() => println!(
                "\nWrote the candidate to {0}: check it with `palisade policy check {0}`, then `palisade replay --policy {0}` or load it as a canary.",
                out.display()
            ),
            Some(_) => {}
            None => print!("\n```toml\n{}```\n", proposal.suggestion.toml),
        }
    }
    if proposal.empty.is_some() {
        anyhow::bail!("nothing to suggest from");
    }
    Ok(())
}
