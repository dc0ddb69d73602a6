//! End-to-end tests of the views of a recorded run (issue 17): the stack
//! filters of `report` and `convert` (`--focus`, `--ignore`, `--fold-lib`,
//! `--depth`, `--full-names`) on real traces, and the offline HTML page of
//! `convert --html` loaded, clicked, searched and photographed in a headless
//! Chromium (`heapprofd_tests::browser`), and its process/heap choice on a
//! trace of three processes, one with a custom heap.
//!
//! Programs: `tests/programs/alloc_truth.cpp` (known sites, a printf
//! through libc's stdio, a thread whose stack ld.so allocates),
//! `tests/programs/record/sites.cpp` (std::vector growth: long C++ names),
//! `analysis.c steps` (a known peak) and `tests/programs/heaps/pool.c` (a
//! custom heap).

use heapprofd_tests::browser::Browser;
use heapprofd_tests::record_harness::{heapprofd_ok, scratch_dir};
use heapprofd_tests::report_harness::{cli_json, peak_trace, prog, recorded, s};
use serde_json::Value;

fn folded(args: &[&str]) -> Vec<(String, u64)> {
    let mut a = vec!["convert"];
    a.extend_from_slice(args);
    a.extend_from_slice(&["--collapsed", "-"]);
    heapprofd_ok(&a)
        .stdout
        .lines()
        .map(|l| {
            let (stack, v) = l.rsplit_once(' ').unwrap();
            (stack.to_owned(), v.parse().unwrap())
        })
        .collect()
}

fn total(f: &[(String, u64)]) -> u64 {
    f.iter().map(|x| x.1).sum()
}

fn self_sites(v: &Value) -> Vec<String> {
    v["heaps"][0]["top_self"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["function"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn filters_focus_ignore_fold_depth_and_names() {
    let dir = scratch_dir("filters");
    let trace = recorded(&dir, "t.pftrace", &["-i", "1"], &[&prog("alloc_truth")]);
    let t = s(&trace);
    let all = cli_json(&["report", "--format", "json", &t]);
    let everything = all["heaps"][0]["totals"]["allocated"].as_u64().unwrap();
    // --focus FUNCTION: only leak_malloc's 100 x 1000 bytes.
    let v = cli_json(&["report", "--format", "json", "--focus", "leak_malloc", &t]);
    assert_eq!(v["heaps"][0]["totals"]["allocated"], 100_000, "{v}");
    assert_eq!(self_sites(&v), ["leak_malloc"]);
    let f = folded(&[&t, "--focus", "leak_malloc"]);
    assert!(
        f.len() == 1 && f[0].0.ends_with(";main;leak_malloc") && f[0].1 == 100_000,
        "{f:?}"
    );
    // --ignore FUNCTION: everything else.
    let v = cli_json(&["report", "--format", "json", "--ignore", "leak_malloc", &t]);
    assert_eq!(
        v["heaps"][0]["totals"]["allocated"].as_u64().unwrap(),
        everything - 100_000
    );
    assert!(!self_sites(&v).contains(&"leak_malloc".to_owned()));
    // A library: the only stacks through ld.so are the thread's TLS.
    let v = cli_json(&["report", "--format", "json", "--focus", "ld-linux", &t]);
    assert_eq!(self_sites(&v), ["allocate_dtv"], "{v}");
    // A glob: every site whose name ends in _site (calloc_site, memalign_site).
    let v = cli_json(&["report", "--format", "json", "--focus", "*_site", &t]);
    let mut sites = self_sites(&v);
    sites.sort();
    assert_eq!(sites, ["calloc_site", "memalign_site"]);
    // --fold-lib libc: printf's stdio internals become the call into libc.
    let plain = folded(&[&t]);
    let (printf, bytes) = plain
        .iter()
        .find(|x| x.0.contains("__vfprintf_internal"))
        .expect("printf's buffer allocation");
    let after_main = printf
        .split(";main;")
        .nth(1)
        .unwrap()
        .split(';')
        .next()
        .unwrap();
    let fold = folded(&[&t, "--fold-lib", "libc"]);
    assert!(
        fold.iter().all(|x| !x.0.contains("__vfprintf_internal")),
        "{fold:?}"
    );
    assert!(
        fold.iter()
            .any(|x| x.0.ends_with(&format!(";main;{after_main}")) && x.1 == *bytes),
        "{after_main}: {fold:?}"
    );
    assert_eq!(total(&fold), total(&plain));
    // report --fold-lib libc: the same, in the report's sites and stacks.
    let stacks_of = |v: &Value| -> Vec<String> {
        v["heaps"][0]["top_self"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|x| x["heaviest_stack"].as_array().unwrap().clone())
            .map(|f| f.as_str().unwrap().to_owned())
            .collect()
    };
    let plain_r = cli_json(&["report", "--format", "json", "--top", "30", &t]);
    assert!(
        stacks_of(&plain_r)
            .iter()
            .any(|f| f == "__vfprintf_internal"),
        "{plain_r}"
    );
    let fold_r = cli_json(&[
        "report",
        "--format",
        "json",
        "--top",
        "30",
        "--fold-lib",
        "libc",
        &t,
    ]);
    assert!(
        !stacks_of(&fold_r)
            .iter()
            .any(|f| f == "__vfprintf_internal"),
        "{fold_r}"
    );
    assert!(
        self_sites(&fold_r).contains(&after_main.to_owned()),
        "{after_main}: {fold_r}"
    );
    assert_eq!(
        fold_r["heaps"][0]["totals"]["allocated"],
        plain_r["heaps"][0]["totals"]["allocated"]
    );
    // --depth N (convert): at most N frames, nothing lost.
    let d2 = folded(&[&t, "--depth", "2"]);
    assert!(d2.iter().all(|x| x.0.split(';').count() <= 2), "{d2:?}");
    assert_eq!(total(&d2), total(&plain));
    // report --depth N: callers per site.
    let text = heapprofd_ok(&["report", "--depth", "1", &t]).stdout;
    let callers = |text: &str| -> Vec<usize> {
        text.lines()
            .filter_map(|l| l.trim_start().strip_prefix("from "))
            .map(|l| l.split(" <- ").filter(|f| *f != "…").count())
            .collect()
    };
    assert!(callers(&text).iter().all(|&n| n == 1), "{text}");
    let deep = heapprofd_ok(&["report", &t]).stdout;
    assert!(callers(&deep).iter().any(|&n| n > 1), "{deep}");
    // C++ names shortened unless --full-names.
    let cpp = recorded(&dir, "cpp.pftrace", &["-i", "1"], &[&prog("sites_cpp")]);
    let short = folded(&[&s(&cpp)]);
    let full = folded(&[&s(&cpp), "--full-names"]);
    let short_grow = short.iter().find(|x| x.0.contains("fill_vector")).unwrap();
    let full_grow = full.iter().find(|x| x.0.contains("fill_vector")).unwrap();
    assert!(
        short_grow.0.contains("std::vector<…>::push_back(…)")
            && !short_grow.0.contains("std::allocator<int>"),
        "{short_grow:?}"
    );
    assert!(
        full_grow
            .0
            .contains("std::vector<int, std::allocator<int> >::push_back(int const&)"),
        "{full_grow:?}"
    );
    assert_eq!(short_grow.1, full_grow.1);
    // report --full-names: the allocator fill_vector's site allocated
    // through, in full or shortened.
    let via = |extra: &[&str]| -> String {
        let mut a = vec!["report", "--format", "json", "--top", "20"];
        a.extend_from_slice(extra);
        let c = s(&cpp);
        a.push(&c);
        let v = cli_json(&a);
        let site = v["heaps"][0]["top_self"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["function"].as_str().unwrap().starts_with("fill_vector"))
            .cloned()
            .unwrap_or_else(|| panic!("no fill_vector site: {v}"));
        site["via"].as_str().unwrap_or_default().to_owned()
    };
    let (short_via, full_via) = (via(&[]), via(&["--full-names"]));
    assert!(
        short_via.starts_with("operator new") && short_via.contains('…'),
        "{short_via}"
    );
    assert!(
        full_via.starts_with("operator new(unsigned long)"),
        "{full_via}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

const FLAME_TEXTS: &str = "[...document.querySelectorAll('#flame .fr')].map(e => e.textContent)";

fn frame_el(name: &str) -> String {
    format!("[...document.querySelectorAll('#flame .fr')].find(e => e.textContent === '{name}')")
}

fn flame_has(b: &mut Browser, name: &str) -> bool {
    b.eval(FLAME_TEXTS)
        .as_array()
        .unwrap()
        .iter()
        .any(|t| t == name)
}

#[test]
fn html_page_works_offline_in_chromium() {
    if heapprofd_tests::browser::chromium().is_none() {
        panic!("chromium is not installed: run scripts/install-deps.sh (Debian package chromium)");
    }
    let dir = scratch_dir("html");
    let trace = peak_trace(&dir);
    let page = dir.join("page.html");
    heapprofd_ok(&["convert", &s(&trace), "--html", &s(&page)]);
    let html = std::fs::read_to_string(&page).unwrap();
    for external in ["<script src", "<link", "@import", "url(http"] {
        assert!(!html.contains(external), "the page loads {external}");
    }
    let mut b = Browser::open(&dir, 1280, 900);
    b.load(&page);
    assert!(
        b.eval("document.title")
            .as_str()
            .unwrap()
            .contains("analysis"),
        "title names the program"
    );
    // Nothing was fetched: the page is self-contained.
    assert_eq!(b.eval("performance.getEntriesByType('resource').length"), 0);
    // The flame graph of allocated bytes has both sites, and a function's
    // calls from different lines are one frame (main calls fgets, printf
    // and the sites).
    assert!(flame_has(&mut b, "peak_site") && flame_has(&mut b, "after_peak_site"));
    let mains = b.eval(&format!("{FLAME_TEXTS}.filter(t => t === 'main').length"));
    assert_eq!(mains, 1, "{}", b.eval(FLAME_TEXTS));
    assert!(
        b.eval("document.getElementById('top-self').textContent")
            .as_str()
            .unwrap()
            .contains("peak_site")
    );
    // Click peak_site: it fills the width, the other site is out of view,
    // its callers stay above as a path back.
    b.click(&frame_el("peak_site"));
    let zoomed = b.eval(&format!(
        "{} .getBoundingClientRect().width / document.getElementById('flame').clientWidth",
        frame_el("peak_site")
    ));
    assert!(zoomed.as_f64().unwrap() > 0.95, "zoomed width {zoomed}");
    assert!(!flame_has(&mut b, "after_peak_site"));
    assert!(
        b.eval("document.querySelectorAll('#flame .fr.anc').length")
            .as_u64()
            > Some(0)
    );
    b.click("document.getElementById('reset')");
    assert!(flame_has(&mut b, "after_peak_site"));
    // Search: typed into the box, the matches light up with their total.
    b.type_text("document.getElementById('search')", "after_peak");
    let matched =
        b.eval("[...document.querySelectorAll('#flame .fr.match')].map(e => e.textContent)");
    assert!(
        matched
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t == "after_peak_site"),
        "{matched}"
    );
    let m = |b: &mut Browser| {
        b.eval("document.getElementById('matched').textContent")
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert!(
        m(&mut b).starts_with("matched 10.00 MiB ("),
        "{}",
        m(&mut b)
    );
    // Unreleased: peak_site freed everything, after_peak_site kept 10 MiB.
    b.click("document.querySelector('input[name=what][value=unrel]')");
    assert!(!flame_has(&mut b, "peak_site"));
    assert!(flame_has(&mut b, "after_peak_site"));
    assert!(
        m(&mut b).starts_with("matched 10.00 MiB ("),
        "{}",
        m(&mut b)
    );
    // Counts: the same search in allocations (10 blocks of 1 MiB).
    b.click("document.querySelector('input[name=unit][value=count]')");
    assert!(m(&mut b).starts_with("matched 10 ("), "{}", m(&mut b));
    // The timeline rises to the peak and falls.
    let ys = b.eval(
        "document.getElementById('unreleased-line').getAttribute('points')\
         .split(' ').map(p => Number(p.split(',')[1]))",
    );
    let ys: Vec<f64> = ys
        .as_array()
        .unwrap()
        .iter()
        .map(|y| y.as_f64().unwrap())
        .collect();
    let top = (0..ys.len())
        .min_by(|&a, &b| ys[a].total_cmp(&ys[b]))
        .unwrap();
    assert!(ys.len() >= 4 && top > 0 && top < ys.len() - 1, "{ys:?}");
    assert!(
        ys[top + 1..].iter().any(|&y| y > ys[top] + 100.0),
        "the fall: {ys:?}"
    );
    let png = b.screenshot();
    assert!(
        png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 20_000,
        "{}",
        png.len()
    );
    let shot = dir.join("page.png");
    std::fs::write(&shot, &png).unwrap();
    if let Some(keep) = std::env::var_os("HEAPPROFD_HTML_SCREENSHOT") {
        std::fs::copy(&shot, keep).unwrap();
    }
    let errors = b.errors();
    assert!(errors.is_empty(), "the page reported errors: {errors:#?}");
    drop(b);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Selects the page's process/heap option whose text contains all of
/// `parts`; returns the option's text.
fn select_heap(b: &mut Browser, parts: &[&str]) -> String {
    let want = serde_json::to_string(parts).unwrap();
    let js = format!(
        "(() => {{ const s = document.getElementById('heap'); \
         const o = [...s.options].find(o => {want}.every(p => o.textContent.includes(p))); \
         if (!o) return null; s.value = o.value; s.dispatchEvent(new Event('change')); \
         return o.textContent; }})()"
    );
    let v = b.eval(&js);
    let options = b.eval("[...document.getElementById('heap').options].map(o => o.textContent)");
    v.as_str()
        .unwrap_or_else(|| panic!("no option with {parts:?} among {options}"))
        .to_owned()
}

#[test]
fn html_page_has_each_process_and_heap() {
    if heapprofd_tests::browser::chromium().is_none() {
        panic!("chromium is not installed: run scripts/install-deps.sh (Debian package chromium)");
    }
    let dir = scratch_dir("html-heaps");
    // Three processes (sh and the two programs it runs, one after the
    // other) and, in `pool`, two heaps: libc.malloc and the custom "pool".
    let cmd = format!("{} 1000; {} diff 1", prog("pool"), prog("analysis"));
    let trace = recorded(
        &dir,
        "t.pftrace",
        &["-i", "1", "--all-heaps"],
        &["sh", "-c", &cmd],
    );
    let page = dir.join("page.html");
    heapprofd_ok(&["convert", &s(&trace), "--html", &s(&page)]);
    let mut b = Browser::open(&dir, 1280, 900);
    b.load(&page);
    let options = b.eval("[...document.getElementById('heap').options].map(o => o.textContent)");
    assert!(
        options.as_array().unwrap().len() >= 4,
        "sh, pool (two heaps), analysis: {options}"
    );
    let top_self = |b: &mut Browser| {
        b.eval("document.getElementById('top-self').textContent")
            .as_str()
            .unwrap()
            .to_owned()
    };
    // Each choice shows its own flame graph, tables and summary.
    let chosen = select_heap(&mut b, &["analysis", "libc.malloc"]);
    assert!(flame_has(&mut b, "grow_site") && !flame_has(&mut b, "pool_fill"));
    assert!(top_self(&mut b).contains("grow_site"), "{chosen}");
    let chosen = select_heap(&mut b, &["pool", ", pool"]);
    assert!(
        flame_has(&mut b, "pool_fill") && !flame_has(&mut b, "grow_site"),
        "{chosen}: {}",
        b.eval(FLAME_TEXTS)
    );
    let summary = b
        .eval("document.getElementById('summary').textContent")
        .as_str()
        .unwrap()
        .to_owned();
    assert!(summary.contains("heap pool"), "{summary}");
    // Its sites are the pool's (pool_alloc, or pool_fill where it is
    // inlined), not analysis's.
    let table = top_self(&mut b);
    assert!(
        table.contains("pool_") && !table.contains("grow_site"),
        "{table}"
    );
    // The same process's malloc heap: its own values (the pool's 64 KiB
    // blocks, where the "pool" heap has 96-byte slots).
    select_heap(&mut b, &["pool", "libc.malloc"]);
    let summary = b
        .eval("document.getElementById('summary').textContent")
        .as_str()
        .unwrap()
        .to_owned();
    assert!(summary.contains("heap libc.malloc"), "{summary}");
    let sizes = b
        .eval("document.getElementById('sizes').textContent")
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(sizes.contains("64.00 KiB"), "the pool's blocks: {sizes}");
    let errors = b.errors();
    assert!(errors.is_empty(), "the page reported errors: {errors:#?}");
    drop(b);
    let _ = std::fs::remove_dir_all(&dir);
}
