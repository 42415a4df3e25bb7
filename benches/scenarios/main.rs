//! Accuracy scenarios (see `engine.rs`): what the default policy does to attackers and to
//! honest users in realistic traffic, on both backends. Run with:
//!
//! ```sh
//! PALISADE_TEST_DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres \
//! PALISADE_TEST_REDIS_URL=redis://127.0.0.1:6379 cargo bench --bench scenarios
//! ```
//!
//! Without the two URLs only the embedded backend runs. `SCENARIOS_SCALE` (default 10) is how
//! much faster than production time runs; `SCENARIOS_ONLY=carrier_nat,…` picks scenarios.
//! Writes the table to `docs/ACCURACY.md` (between its markers) and prints it.

use std::fmt::Write as _;

#[path = "../../tests/api/helpers/mod.rs"]
mod helpers;

mod engine;

use engine::{Report, Size};
use helpers::{Backend, TestApp};

/// The same allocator as the `palisade` binary.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const BEGIN: &str = "<!-- scenarios:begin -->";
const END: &str = "<!-- scenarios:end -->";

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let scale: u64 = std::env::var("SCENARIOS_SCALE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let only: Option<Vec<String>> = std::env::var("SCENARIOS_ONLY")
        .ok()
        .map(|v| v.split(',').map(str::to_owned).collect());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let mut rows = Vec::new();
    for scenario in engine::all(Size::FULL) {
        if only
            .as_ref()
            .is_some_and(|names| !names.iter().any(|n| n == scenario.name))
        {
            continue;
        }
        for backend in [Backend::Embedded, Backend::Production] {
            let report = runtime.block_on(async {
                let app = TestApp::spawn_with(backend, |settings| {
                    engine::scale_settings(settings, scale)
                })
                .await?;
                Some(engine::run(&app, &scenario, scale).await)
            });
            let Some(report) = report else {
                eprintln!(
                    "{}: production backend not configured; skipped",
                    scenario.name
                );
                continue;
            };
            eprintln!(
                "{} on {backend:?}: {:.1} s, honest reasons {:?}",
                scenario.name,
                report.wall.as_secs_f64(),
                report.honest_reasons
            );
            rows.push((scenario.what, backend, report));
        }
    }
    let table = render(&rows, scale);
    println!("{table}");
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/ACCURACY.md");
    if let Ok(doc) = std::fs::read_to_string(&path)
        && let (Some(begin), Some(end)) = (doc.find(BEGIN), doc.find(END))
        && only.is_none()
    {
        let updated = format!("{}{BEGIN}\n{table}{}", &doc[..begin], &doc[end..]);
        std::fs::write(&path, updated).expect("write docs/ACCURACY.md");
        eprintln!("wrote {}", path.display());
    }
}

fn render(rows: &[(&str, Backend, Report)], scale: u64) -> String {
    let mut out = String::new();
    let date = std::process::Command::new("date")
        .arg("+%Y-%m-%d")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "`cargo bench --bench scenarios`, {date}: time {scale}x faster, every period of the \
         default policy divided by {scale}; 300 simulated seconds per scenario.\n"
    );
    out.push_str(
        "| scenario | backend | attacker requests | refused | challenged, never passed | admitted (an OTP scenario: messages sent) | stopped after it was first stopped | first stopped after | honest requests refused | honest users refused (a 429) | honest users challenged |\n\
         |---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for (what, backend, r) in rows {
        let backend = match backend {
            Backend::Embedded => "embedded",
            Backend::Production => "Postgres + Redis",
        };
        let first = r.first_block_ms.map_or("never".to_owned(), |ms| {
            format!("{:.0} s", ms as f64 / 1000.0)
        });
        let attacker = if r.attacker.0 == 0 {
            "– | – | – | – | – | –".to_owned()
        } else {
            format!(
                "{} | {:.1} % | {:.1} % | {} | {:.1} % | {first}",
                r.attacker.0,
                Report::pct(r.attacker),
                Report::pct((r.attacker.0, r.attacker_challenged)),
                r.attacker.0 - r.attacker.1 - r.attacker_challenged,
                Report::pct(r.attacker_after_first),
            )
        };
        let _ = writeln!(
            out,
            "| `{}`: {what} | {backend} | {attacker} | {:.2} % of {} | {:.2} % of {} | {:.2} % |",
            r.name,
            Report::pct(r.honest),
            r.honest.0,
            Report::pct(r.users),
            r.users.0,
            Report::pct((r.users.0, r.users_challenged)),
        );
    }
    let retried: Vec<_> = rows
        .iter()
        .filter(|(_, _, r)| r.retried.iter().any(|(requests, ..)| *requests > 0))
        .collect();
    if !retried.is_empty() {
        out.push_str(
            "\nClients that retry a 429, per kind: requests (first attempts), attempts in all, and requests never admitted (the client gave up).\n\n\
             | scenario | backend | retry as docs/CLIENTS.md asks: requests | attempts | gave up | retry every 250 ms: requests | attempts | gave up |\n\
             |---|---|---|---|---|---|---|---|\n",
        );
        for (_, backend, r) in retried {
            let [(p, pa, pg), (i, ia, ig)] = r.retried;
            let _ = writeln!(
                out,
                "| `{}` | {} | {p} | {pa} | {pg} | {i} | {ia} | {ig} |",
                r.name,
                match backend {
                    Backend::Embedded => "embedded",
                    Backend::Production => "Postgres + Redis",
                },
            );
        }
    }
    out
}
