//! The soak's side-by-side table (Markdown, as docs/benchmarks.md shows it) and the details
//! behind every count that should be 0.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::plan::AgentEnd;
use super::{ProcSample, SoakOpts, Variant, VariantRun};
use crate::bench::percentile;

/// The table for `runs` (each a column), then the details.
pub fn table(opts: &SoakOpts, runs: &[VariantRun]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Chaos soak, seed {} ({} lifecycles, {} pods at a time)\n",
        opts.seed, opts.lifecycles, opts.concurrency
    );
    let head: Vec<&str> = runs.iter().map(|r| r.variant.label()).collect();
    let _ = writeln!(out, "| | {} |", head.join(" | "));
    let _ = writeln!(out, "|---|{}", "---|".repeat(runs.len()));
    let mut row = |name: &str, cell: &dyn Fn(&VariantRun) -> String| {
        let cells: Vec<String> = runs.iter().map(cell).collect();
        let _ = writeln!(out, "| {name} | {} |", cells.join(" | "));
    };
    let agent_only = |r: &VariantRun, s: String| match r.variant {
        Variant::Holdfast => s,
        Variant::Baseline => "—".into(),
    };
    row(
        "lifecycles (boot callers / shutdown callers / Jobs / downloads)",
        &|r| {
            let k = |n: &str| r.tally.by_kind.get(n).copied().unwrap_or(0);
            format!("{} / {} / {} / {}", k("boot"), k("call"), k("job"), k("dl"))
        },
    );
    row(
        "boot callers restarted whole: sandbox recreated / in place",
        &|r| {
            format!(
                "{} / {}",
                r.tally.sandbox_recreations, r.tally.in_place_restarts
            )
        },
    );
    row(
        "downloads through a drain cut / bytes not delivered",
        &|r| {
            format!(
                "{} of {} / {}",
                r.tally.downloads_cut.len(),
                r.tally.downloads,
                r.tally.bytes_missing
            )
        },
    );
    row("calls ok / failed", &|r| {
        format!("{} / {}", r.tally.calls_ok, r.tally.calls_failed)
    });
    row("refused calls, all", &|r| r.tally.refused.to_string());
    row("refused outside the fail-open window (goal 0)", &|r| {
        agent_only(r, r.tally.refused_outside.len().to_string())
    });
    row("refused inside the window (no agent bound)", &|r| {
        agent_only(r, r.tally.refused_in_window.to_string())
    });
    row("call timeouts (Envoy frozen) / resets", &|r| {
        format!("{} / {}", r.tally.timeouts, r.tally.resets_or_closed)
    });
    row("boot callers crashed and restarted", &|r| {
        r.tally.app_restarts.to_string()
    });
    row("Jobs that never completed", &|r| {
        format!("{} of {}", r.tally.jobs_never_completed, r.tally.jobs)
    });
    row("drains: proxy outlived the app by > 2 s", &|r| {
        format!("{} of {}", r.tally.proxy_outlived_app, r.tally.drains)
    });
    row("  … by cause (unexplained: goal 0)", &|r| {
        let mut by: BTreeMap<&str, usize> = BTreeMap::new();
        for (cause, _) in &r.tally.slow_drains {
            *by.entry(cause.as_str()).or_default() += 1;
        }
        if by.is_empty() {
            "—".to_string()
        } else {
            by.iter()
                .map(|(c, n)| format!("{c} {n}"))
                .collect::<Vec<_>>()
                .join(", ")
        }
    });
    row("drain lag p50 / p99 (proxy exit − app exit)", &|r| {
        let p =
            |q| percentile(&r.tally.drain_lag_ms, q).map_or("—".into(), |v| format!("{v:.0} ms"));
        format!("{} / {}", p(0.5), p(0.99))
    });
    row(
        "drains crossed by an agent outage / not adopted (goal 0)",
        &|r| {
            agent_only(
                r,
                format!(
                    "{} / {}",
                    r.tally.drains_crossed,
                    r.tally.drains_not_adopted.len()
                ),
            )
        },
    );
    row(
        "stale hold rules or queues in running pods (goal 0)",
        &|r| agent_only(r, r.tally.stale_holds.len().to_string()),
    );
    row(
        "leftover rules, netns, cgroups, processes after the run (goal 0)",
        &|r| r.leftovers.len().to_string(),
    );
    row("agent panics (goal 0)", &|r| {
        agent_only(r, r.panics.len().to_string())
    });
    row(
        "agent restarts: SIGKILL / SIGTERM (skipped: one under way)",
        &|r| {
            let n = |e| r.outages.iter().filter(|o| o.end == e).count();
            agent_only(
                r,
                format!(
                    "{} / {} ({})",
                    n(AgentEnd::Sigkill),
                    n(AgentEnd::Sigterm),
                    r.restarts_skipped
                ),
            )
        },
    );
    row(
        "SIGTERM exits over 10 s / successors that never answered",
        &|r| {
            let slow = r.outages.iter().filter(|o| o.slow_exit).count();
            let dead = r.outages.iter().filter(|o| o.up_us.is_none()).count();
            agent_only(r, format!("{slow} / {dead}"))
        },
    );
    row("Envoy SIGKILLs / SIGSTOPs", &|r| {
        format!("{} / {}", r.tally.envoy_kills, r.tally.envoy_freezes)
    });
    row(
        "status API flood: connections / closed by the agent",
        &|r| agent_only(r, format!("{} / {}", r.flood[0], r.flood[1])),
    );
    row("status API flood: requests answered / failed", &|r| {
        agent_only(r, format!("{} / {}", r.flood[2], r.flood[3]))
    });
    row(
        "agent fds / threads / RSS: start → end (quiet, no pods)",
        &|r| agent_only(r, resources(r.agent_start, r.agent_end)),
    );
    row("lifecycles the final agent lived through", &|r| {
        agent_only(r, r.final_agent_lifecycles.to_string())
    });
    row(
        "final agent's /metrics: drains app-done / deadline / proxy-gone-early",
        &|r| {
            let m = |k: &str| metric(r, &format!("holdfast_drains_total{{outcome=\"{k}\"}}"));
            agent_only(
                r,
                format!(
                    "{} / {} / {}",
                    m("app-done"),
                    m("deadline"),
                    m("proxy-gone-early")
                ),
            )
        },
    );
    row(
        "final agent's /metrics: Jobs completed; holds released ready / deadline",
        &|r| {
            let m = |k: &str| metric(r, k);
            agent_only(
                r,
                format!(
                    "{}; {} / {}",
                    m("holdfast_jobs_total{outcome=\"completed\"}"),
                    m("holdfast_holds_released_total{outcome=\"ready\"}"),
                    m("holdfast_holds_released_total{outcome=\"deadline\"}")
                ),
            )
        },
    );
    row(
        "final agent's /metrics: status API connections rejected at the cap",
        &|r| {
            agent_only(
                r,
                metric(r, "holdfast_status_api_rejected_connections_total"),
            )
        },
    );
    row(
        "pods the final agent still counts in a live phase at the end (goal 0)",
        &|r| agent_only(r, super::pods_left_in_live_phases(r).to_string()),
    );
    row("stages stuck (goal 0)", &|r| {
        r.tally.stuck.len().to_string()
    });
    row("wall time; load average before → after", &|r| {
        format!(
            "{:.0} s; {} → {}",
            r.took.as_secs_f64(),
            r.load_before,
            r.load_after
        )
    });
    for r in runs {
        if let Some(v) = &r.versus {
            versus_table(&mut out, v);
        }
    }
    for r in runs {
        details(&mut out, opts.seed, r);
    }
    out
}

/// holdfast's lifecycles against the baseline's, count by count.
fn versus_table(out: &mut String, v: &super::versus::Versus) {
    let _ = writeln!(
        out,
        "\nPer lifecycle, holdfast against the baseline (same seed; outside the fail-open window)\n"
    );
    let _ = writeln!(
        out,
        "| count | better | same | worse (goal 0) | holdfast | no agent |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|");
    for c in &v.counts {
        let (with, without) = if c.name.ends_with("ms") {
            (
                format!("p50 {:.0}", c.with),
                format!("p50 {:.0}", c.without),
            )
        } else {
            (format!("{:.0}", c.with), format!("{:.0}", c.without))
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {with} | {without} |",
            c.name, c.better, c.same, c.worse
        );
    }
    let _ = writeln!(
        out,
        "| lifecycles worse on any count (goal 0) | | | {} | | |",
        v.lifecycles_worse()
    );
    if v.unmatched > 0 {
        let _ = writeln!(out, "\n{} lifecycles ran in one variant only", v.unmatched);
    }
}

/// One sample of the final agent's metrics, or `?`.
fn metric(r: &VariantRun, name: &str) -> String {
    r.final_metrics
        .iter()
        .find(|(n, _)| n == name)
        .map_or("?".into(), |(_, v)| v.to_string())
}

fn resources(start: Option<ProcSample>, end: Option<ProcSample>) -> String {
    let f = |s: Option<ProcSample>| {
        s.map_or("?".into(), |s| {
            format!(
                "{} / {} / {:.1} MiB",
                s.fds,
                s.threads,
                s.rss_kib as f64 / 1024.0
            )
        })
    };
    format!("{} → {}", f(start), f(end))
}

fn details(out: &mut String, seed: u64, r: &VariantRun) {
    let t = &r.tally;
    let mut list = |what: &str, items: &[String]| {
        if items.is_empty() {
            return;
        }
        let _ = writeln!(out, "\n{} (seed {seed}), {what}:", r.variant.label());
        for i in items.iter().take(20) {
            let _ = writeln!(out, "  {i}");
        }
        if items.len() > 20 {
            let _ = writeln!(out, "  … and {} more", items.len() - 20);
        }
    };
    if r.variant == Variant::Holdfast {
        list(
            "refused calls outside the fail-open window",
            &t.refused_outside,
        );
        list("drains not adopted", &t.drains_not_adopted);
        // The unexplained ones (goal 0) first: the list is cut at 20.
        let mut slow: Vec<(bool, String)> = t
            .slow_drains
            .iter()
            .map(|(c, d)| {
                (
                    *c != super::tally::SlowDrain::Unexplained,
                    format!("[{}] {d}", c.as_str()),
                )
            })
            .collect();
        slow.sort_by_key(|(explained, _)| *explained);
        let slow: Vec<String> = slow.into_iter().map(|(_, d)| d).collect();
        list(
            "slow drains (proxy outlived the app by > 2 s), by cause",
            &slow,
        );
        list("stale holds", &t.stale_holds);
        if let Some(v) = &r.versus {
            list("lifecycles worse than without holdfast", &v.worse);
        }
        list("agent panics", &r.panics);
        let outages: Vec<String> = r.outages.iter().map(|o| format!("{o}")).collect();
        list("agent outages", &outages);
    }
    list("downloads cut", &t.downloads_cut);
    list("stuck stages", &t.stuck);
    list("leftovers", &r.leftovers);
}
