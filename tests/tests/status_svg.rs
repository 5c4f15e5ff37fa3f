//! `holdfast status POD --svg FILE`'s picture, rendered by a real browser: Debian's Chromium,
//! headless. The SVG (holdfast::cli::svg) of a pod's whole life — hold, proxy ready, release,
//! drain, quit — must parse as XML in the browser (no parser error page; a deliberately broken
//! copy must show one, so the check can fail), and its screenshot must show each lane's bar in
//! its colour where the time axis puts it, and the proxy-ready line. The PNG is decoded here
//! (8-bit RGB/RGBA, the five scanline filters; flate2 inflates).
//!
//! Needs `chromium` (scripts/setup.sh installs it); without it the test skips with a message,
//! and fails when CI is set.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use holdfast::api::{Mesh, Phase, PodStatus, SidecarMode, Step, StepKind, Timeline};
use holdfast::cli::svg;

fn t(ms: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000) + Duration::from_millis(ms)
}

/// A classic pod's life as the agent records it (docs/reference.md's example timeline).
fn pod() -> PodStatus {
    use StepKind::*;
    let steps = [
        (0, FirstSeen, None),
        (52, NetnsFound, None),
        (111, HoldIn, None),
        (219, FirstConnectionHeld, Some("held <1> & more")),
        (300, ProxyRunning, Some("istio-proxy")),
        (420, EnvoyStarted, None),
        (600, EnvoyListening, None),
        (700, EnvoyLive, None),
        (2845, ProxyReady, None),
        (
            2886,
            HoldReleased,
            Some("ready: held 2 connection(s) for 2.7 s"),
        ),
        (6000, DrainStarted, None),
        (6010, InboundDrained, None),
        (8800, AppContainerExited, Some("app")),
        (8805, AppGone, None),
        (8910, Quitting, Some("nothing in flight")),
        (8949, ProxyExited, None),
        (10000, DrainFinished, Some("app-done")),
    ];
    PodStatus {
        namespace: "default".into(),
        name: "flusher".into(),
        uid: "5a7e2c1b-0000-4000-8000-000000000001".into(),
        phase: Phase::Done,
        mode: Some(SidecarMode::Classic),
        mesh: Some(Mesh::Istio),
        tracked_since: t(0),
        hold: None,
        drain: None,
        job: None,
        last_error: None,
        skipped_reason: None,
        timeline: Some(Timeline {
            steps: steps
                .iter()
                .map(|(ms, step, d)| Step {
                    at: t(*ms),
                    step: *step,
                    detail: d.map(str::to_string),
                })
                .collect(),
            dropped: 0,
        }),
    }
}

fn chromium() -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("chromium"))
            .find(|p| p.is_file())
    })
}

struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs headless Chromium on `file` with `args`, bounded: its stdout.
fn run_chromium(bin: &Path, profile: &Path, args: &[String], file: &Path) -> String {
    let mut child = Command::new(bin)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--force-device-scale-factor=1",
            "--no-first-run",
            "--disable-dev-shm-usage",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(format!("file://{}", file.display()))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start chromium");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        if child.try_wait().expect("wait").is_some() {
            break;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("chromium did not finish within 60 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut out = String::new();
    use std::io::Read;
    child
        .stdout
        .take()
        .expect("stdout")
        .read_to_string(&mut out)
        .expect("read");
    out
}

/// An 8-bit RGB(A) PNG, decoded: (width, height, RGB pixels row by row).
fn decode_png(bytes: &[u8]) -> (usize, usize, Vec<[u8; 3]>) {
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
    let mut pos = 8;
    let (mut width, mut height, mut channels) = (0usize, 0usize, 0usize);
    let mut idat = Vec::new();
    while pos + 8 <= bytes.len() {
        let len = u32::from_be_bytes(bytes[pos..pos + 4].try_into().unwrap()) as usize;
        let kind = &bytes[pos + 4..pos + 8];
        let data = &bytes[pos + 8..pos + 8 + len];
        match kind {
            b"IHDR" => {
                width = u32::from_be_bytes(data[0..4].try_into().unwrap()) as usize;
                height = u32::from_be_bytes(data[4..8].try_into().unwrap()) as usize;
                assert_eq!(data[8], 8, "bit depth");
                channels = match data[9] {
                    2 => 3,
                    6 => 4,
                    other => panic!("colour type {other}"),
                };
                assert_eq!(data[12], 0, "interlaced");
            }
            b"IDAT" => idat.extend_from_slice(data),
            b"IEND" => break,
            _ => {}
        }
        pos += 12 + len;
    }
    let mut raw = Vec::new();
    use std::io::Read;
    flate2::read::ZlibDecoder::new(&idat[..])
        .read_to_end(&mut raw)
        .expect("inflate");
    let stride = width * channels;
    let mut prev = vec![0u8; stride];
    let mut pixels = Vec::with_capacity(width * height);
    for row in 0..height {
        let line = &raw[row * (stride + 1)..(row + 1) * (stride + 1)];
        let filter = line[0];
        let mut cur = line[1..].to_vec();
        for i in 0..stride {
            let a = if i >= channels { cur[i - channels] } else { 0 };
            let b = prev[i];
            let c = if i >= channels { prev[i - channels] } else { 0 };
            let add = match filter {
                0 => 0,
                1 => a,
                2 => b,
                3 => ((u16::from(a) + u16::from(b)) / 2) as u8,
                4 => {
                    let p = i16::from(a) + i16::from(b) - i16::from(c);
                    let (pa, pb, pc) = (
                        (p - i16::from(a)).abs(),
                        (p - i16::from(b)).abs(),
                        (p - i16::from(c)).abs(),
                    );
                    if pa <= pb && pa <= pc {
                        a
                    } else if pb <= pc {
                        b
                    } else {
                        c
                    }
                }
                f => panic!("filter {f}"),
            };
            cur[i] = cur[i].wrapping_add(add);
        }
        for px in cur.chunks(channels) {
            pixels.push([px[0], px[1], px[2]]);
        }
        prev = cur;
    }
    (width, height, pixels)
}

fn hex(c: &str) -> [u8; 3] {
    let v = u32::from_str_radix(c.trim_start_matches('#'), 16).expect("hex colour");
    [(v >> 16) as u8, (v >> 8) as u8, v as u8]
}

fn close(a: [u8; 3], b: [u8; 3]) -> bool {
    a.iter().zip(b).all(|(x, y)| x.abs_diff(y) <= 12)
}

/// The centre of the `data-lane` bar's rectangle in the SVG: (x, y).
fn bar_centre(svg_text: &str, lane: &str) -> (f64, f64) {
    let at = svg_text
        .find(&format!("data-lane=\"{lane}\""))
        .unwrap_or_else(|| panic!("no {lane} bar"));
    let tag = &svg_text[at..svg_text[at..].find('>').map(|e| at + e).unwrap()];
    let attr = |name: &str| -> f64 {
        let s = tag.find(&format!(" {name}=\"")).expect("attribute") + name.len() + 3;
        tag[s..s + tag[s..].find('"').unwrap()]
            .parse()
            .expect("number")
    };
    (
        attr("x") + attr("width") / 2.0,
        attr("y") + attr("height") / 2.0,
    )
}

#[test]
fn the_timeline_svg_renders_in_chromium() {
    let Some(bin) = chromium() else {
        let why = "no chromium on PATH: run scripts/setup.sh (Debian's chromium)";
        if std::env::var_os("CI").is_some() {
            panic!("{why} (CI is set: not skipping)");
        }
        eprintln!("SKIP: {why}");
        return;
    };
    let dir = std::env::temp_dir().join(format!("hf-svg-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch");
    let scratch = Scratch(dir.clone());
    let text = svg::render("node-a", &pod(), t(20_000)).expect("an svg");
    let file = dir.join("flusher.svg");
    std::fs::write(&file, &text).expect("write svg");
    // A broken copy (an unescaped `&`): the browser's parser must refuse it, or the check below
    // proves nothing.
    let broken = dir.join("broken.svg");
    std::fs::write(&broken, text.replace("&amp;", "&")).expect("write");
    let profile = dir.join("profile");

    let dom = run_chromium(&bin, &profile, &["--dump-dom".into()], &file);
    assert!(
        dom.contains("<svg"),
        "chromium did not load the SVG:\n{dom}"
    );
    assert!(
        !dom.contains("parsererror"),
        "the SVG does not parse:\n{dom}"
    );
    assert!(dom.contains("flusher"), "{dom}");
    let bad = run_chromium(&bin, &profile, &["--dump-dom".into()], &broken);
    assert!(
        bad.contains("parsererror"),
        "a broken SVG must show the parser's error:\n{bad}"
    );

    let shot = dir.join("shot.png");
    run_chromium(
        &bin,
        &profile,
        &[
            format!("--screenshot={}", shot.display()),
            format!("--window-size={},{}", svg::WIDTH as u32, 260),
        ],
        &file,
    );
    let png = std::fs::read(&shot).expect("chromium wrote the screenshot");
    let (w, h, px) = decode_png(&png);
    let at =
        |x: f64, y: f64| px[(y.round() as usize).min(h - 1) * w + (x.round() as usize).min(w - 1)];
    for (lane, colour) in svg::LANES {
        let (x, y) = bar_centre(&text, lane);
        let seen = at(x, y);
        assert!(
            close(seen, hex(colour)),
            "the {lane} bar at ({x:.0}, {y:.0}) is {seen:?}, not {colour}"
        );
    }
    // The proxy-ready line: 2845 ms of 10 000 across the plot.
    let ready_x = {
        let s = text.find("class=\"ready\" x1=\"").expect("ready line") + 18;
        text[s..s + text[s..].find('"').unwrap()]
            .parse::<f64>()
            .unwrap()
    };
    let (_, drain_y) = bar_centre(&text, "drain");
    let ready = (-1i32..=1)
        .map(|d| at(ready_x + f64::from(d), drain_y - 20.0))
        .any(|p| close(p, hex(svg::READY_COLOUR)));
    assert!(ready, "no proxy-ready line at x {ready_x:.0}");
    // The background is white where nothing is drawn (the page is the SVG, not an error).
    assert!(close(at(5.0, h as f64 - 5.0), [255, 255, 255]));
    eprintln!("rendered {w}x{h}, {} bytes of PNG", png.len());
    if let Some(keep) = std::env::var_os("HOLDFAST_KEEP_SVG") {
        let keep = PathBuf::from(keep);
        let _ = std::fs::copy(&file, keep.join("timeline.svg"));
        let _ = std::fs::copy(&shot, keep.join("timeline.png"));
    }
    drop(scratch);
}
