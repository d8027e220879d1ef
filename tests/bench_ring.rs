//! `ringserve bench ring`: the table (records written in place, or in bulk with `--fill slice`)
//! reports each side's stalls, sleeps and wakes, and `--stress`
//! (with and without SIGKILLed producers) checks every record and writes its JSON report.

use std::process::Command;

fn ringserve(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ringserve"))
        .args(args)
        .output()
        .expect("run ringserve")
}

#[test]
fn table_counts_futex_sleeps_and_stalls() {
    let text = futex_table(&[]);
    assert!(text.contains("written in place"), "{text}");
}

#[test]
fn table_of_the_bulk_path_counts_the_same() {
    // push_slice on the sender, pop_runs_wait on the sink, every size and batch.
    let text = futex_table(&["--fill", "slice"]);
    assert!(
        text.contains("written from arrays with push_slice"),
        "{text}"
    );
}

/// The throughput table with futex waits (and `extra` arguments), checked row by row.
fn futex_table(extra: &[&str]) -> String {
    let mut args = vec![
        "bench",
        "ring",
        "--records",
        "20000",
        "--round-trips",
        "200",
        "--repeats",
        "1",
        "--wait",
        "futex",
    ];
    args.extend_from_slice(extra);
    let out = ringserve(&args);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("producer full/reloads"), "{text}");
    assert!(text.contains("bare shared word, spin"), "{text}");
    // One row per record size and batch, each with two stats cells of the form a/b c/d.
    let rows: Vec<&str> = text
        .lines()
        .filter(|l| l.trim_start().starts_with(char::is_numeric) && l.contains(" futex "))
        .collect();
    assert_eq!(rows.len(), 8, "{text}");
    for row in rows {
        let fields: Vec<&str> = row.split_whitespace().collect();
        // ... producer stalls/reloads, sleeps/wakes, then the consumer's: four `a/b` counts.
        for cell in &fields[fields.len() - 4..] {
            let (a, b) = cell.split_once('/').unwrap_or_else(|| panic!("{row}"));
            assert!(
                a.parse::<u64>().is_ok() && b.parse::<u64>().is_ok(),
                "{row}"
            );
        }
    }
    text
}

fn stress(extra: &[&str]) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("stress.json");
    let mut args = vec![
        "bench",
        "ring",
        "--stress",
        "--duration",
        "2",
        "--interval",
        "0.5",
        "--json",
        json.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let out = ringserve(&args);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("result: clean"), "{text}");
    serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap()
}

#[test]
fn stress_checks_every_record_of_two_pairs() {
    let report = stress(&["--pairs", "2"]);
    assert_eq!(report["clean"], true, "{report:#}");
    assert_eq!(report["torn"], 0);
    assert_eq!(report["lost"], 0);
    let pairs = report["pairs"].as_array().unwrap();
    assert_eq!(pairs.len(), 2);
    for p in pairs {
        assert!(p["records"].as_u64().unwrap() > 1000, "{p:#}");
        assert!(p["round_trip"]["count"].as_u64().unwrap() > 0, "{p:#}");
        assert_eq!(p["incarnations"], 1);
    }
    let series = report["series"].as_array().unwrap();
    assert!(series.len() >= 3, "{report:#}");
    assert_eq!(report["faults"]["kills"], 0);
}

#[test]
fn stress_fault_mode_sees_every_kill_and_no_torn_record() {
    let report = stress(&["--kill-every", "150"]);
    let faults = &report["faults"];
    let kills = faults["kills"].as_u64().unwrap();
    assert!(kills >= 2, "{report:#}");
    assert_eq!(faults["detected"].as_u64().unwrap(), kills, "{report:#}");
    assert_eq!(report["torn"], 0);
    assert_eq!(report["lost"], 0);
    // Every restarted producer took the role over and wrote.
    assert_eq!(
        report["pairs"][0]["incarnations"].as_u64().unwrap(),
        kills + 1
    );
    assert!(report["records"].as_u64().unwrap() > 1000);
    assert!(faults["detection"]["max_ns"].as_u64().unwrap() < 1_000_000_000);
}
