//! The Job watch: for a pod that is not being deleted, quit the proxy once every app container
//! has exited for good (`restartPolicy: Never`, or `OnFailure` with exit code 0), so the pod
//! completes. This executor only samples and performs; every rule is in `decide.rs`.

use std::time::SystemTime;

use tokio::sync::watch;
// tokio's clock throughout, so paused-time tests drive the deadlines.
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::admin::{Drainer, ProxyAdmin};
use super::app_exit::PodProcessSource;
use super::step::JobSettle;
use super::{decide, DrainCtx, DrainStep, JobOutcome, JobReport, QuitReason, Started};
use crate::pod::PodView;

/// Quits the proxy of a Job-like pod once its app has finished for good, so the pod completes.
/// Call after the startup hold for a pod that is not being deleted; returns at once with
/// [`JobOutcome::NotAJob`] for `restartPolicy: Always`, with [`JobOutcome::Deleting`] when a
/// deletion starts (call [`super::drain`] then), and otherwise when the proxy was quit, the pod is gone
/// or the agent stops.
pub async fn finish_job<A: ProxyAdmin, S: PodProcessSource>(ctx: DrainCtx<'_, A, S>) -> JobReport {
    let Started {
        mut d,
        mut app,
        mut view,
        stop,
        settings,
    } = ctx.start(Instant::now(), SystemTime::now());
    let mut report = JobReport::new(JobOutcome::NotAJob);
    let mut current = match view.borrow_and_update().clone() {
        Some(v) => v,
        None => return finish(report, JobOutcome::PodGone, d),
    };
    if !current.restart_policy.is_job() {
        return finish(report, JobOutcome::NotAJob, d);
    }
    tracing::debug!(
        restart_policy = current.restart_policy.as_str(),
        "watching for the job's app to finish"
    );

    let finished_at = loop {
        if current.deletion.is_some() {
            return finish(report, JobOutcome::Deleting, d);
        }
        let snapshot = app.refresh(&current).await;
        if let Some(by) = decide::job_finished(&current, &snapshot) {
            report.finished_by = Some(by);
            d.tell(DrainStep::JobFinished(by));
            break app.last_exit().unwrap_or_else(Instant::now);
        }
        tokio::select! {
            biased;
            _ = stop.cancelled() => return finish(report, JobOutcome::AgentStopping, d),
            changed = view.changed() => match (changed, view.borrow_and_update().clone()) {
                (Ok(()), Some(v)) => current = v,
                _ => return finish(report, JobOutcome::PodGone, d),
            },
            (pid, _) = app.next_exit() => {
                // Exits of processes that end together cost one look at the pod (issue 29).
                let more = app.take_ready_exits();
                tracing::debug!(pid, more, "job process exited");
            }
            _ = tokio::time::sleep(settings.job_rescan_every) => {}
        }
    };
    report.app_finished_at = Some(d.wall(finished_at));
    tracing::info!(by = ?report.finished_by, "the job's app finished for good; quitting its proxy once nothing is in flight");

    let texts = current.profile.texts();
    let reason = match settle(&mut d, texts, &stop, &mut view).await {
        Ok(reason) => reason,
        Err(outcome) => return finish(report, outcome, d),
    };
    let (sent, exited) = d.quit(reason).await;
    report.quit_sent_at = sent;
    report.proxy_exit_seen_at = exited;
    report.quit_reason = Some(reason);
    let outcome = match (sent, exited) {
        (None, Some(_)) => JobOutcome::ProxyAlreadyGone,
        (_, Some(_)) => JobOutcome::Completed,
        // Asked (or the ask failed) and Envoy still answers: the pod will not complete.
        (_, None) => JobOutcome::ProxyNotStopped,
    };
    finish(report, outcome, d)
}

/// Waits (bounded) for in-flight traffic to settle once the Job's app has finished: why to quit
/// the proxy now, or how the watch ends without a quit. The step (`step.rs`) keeps the judge,
/// the counts and the told-once flag; this loop asks Envoy and sleeps.
async fn settle<A: ProxyAdmin>(
    d: &mut Drainer<'_, A>,
    texts: &'static crate::mesh::MeshTexts,
    stop: &CancellationToken,
    view: &mut watch::Receiver<Option<PodView>>,
) -> Result<QuitReason, JobOutcome> {
    let settings = d.settings;
    let mut settle = JobSettle::new(settings, texts, Instant::now());
    loop {
        let judgement = match d.sample(true).await {
            Ok(sample) => {
                let sampled = settle.sampled(Instant::now(), &sample);
                if let Some(step) = sampled.flushing {
                    d.tell(step);
                }
                if let Some(advice) = sampled.advice {
                    tracing::warn!("{advice}");
                    d.errors.push(advice);
                }
                sampled.judgement
            }
            Err(()) => {
                settle.sample_failed();
                None
            }
        };
        match settle.decide(d.envoy_gone(), judgement, Instant::now()) {
            decide::JobNext::Wait => {}
            decide::JobNext::ProxyAlreadyGone => {
                tracing::info!("the job's proxy has already exited");
                return Err(JobOutcome::ProxyAlreadyGone);
            }
            decide::JobNext::Quit(reason) => {
                if reason == QuitReason::OutOfTime {
                    d.errors.push(format!(
                        "traffic still in flight {} after the job finished; quitting the proxy anyway",
                        crate::config::format_duration(settings.job_in_flight_wait)
                    ));
                }
                return Ok(reason);
            }
        }
        tokio::select! {
            biased;
            _ = stop.cancelled() => return Err(JobOutcome::AgentStopping),
            changed = view.changed() => match (changed, view.borrow_and_update().clone()) {
                (Ok(()), Some(v)) if v.deletion.is_some() => return Err(JobOutcome::Deleting),
                (Ok(()), Some(_)) => {}
                _ => return Err(JobOutcome::PodGone),
            },
            _ = tokio::time::sleep(settle.wait()) => {}
        }
    }
}

/// The report of a Job watch that ends with `outcome`.
fn finish<A>(mut report: JobReport, outcome: JobOutcome, d: Drainer<'_, A>) -> JobReport {
    report.outcome = outcome;
    report.app_finished_to_quit = report
        .app_finished_at
        .zip(report.quit_sent_at)
        .and_then(|(a, q)| q.duration_since(a).ok());
    report.errors = d.errors.kept;
    report.error_count = d.errors.count;
    if !matches!(outcome, JobOutcome::NotAJob) {
        tracing::debug!(
            outcome = outcome.as_str(),
            finished_by = ?report.finished_by,
            app_finished_to_quit_ms = report.app_finished_to_quit.map(|d| d.as_secs_f64() * 1e3),
            "job watch finished"
        );
    }
    report
}
