//! Runs the built `softrdma devices` binary against the host and against config files.

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

fn softrdma(config: Option<&PathBuf>, args: &[&str]) -> Output {
    softrdma_env(config, None, args)
}

/// Runs `softrdma ARGS` with `SOFTRDMA_CONFIG` and `SOFTRDMA_TRANSPORTS` set or removed.
fn softrdma_env(config: Option<&PathBuf>, transports: Option<&str>, args: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_softrdma"));
    cmd.args(args).env_remove("RUST_LOG");
    match transports {
        Some(t) => cmd.env("SOFTRDMA_TRANSPORTS", t),
        None => cmd.env_remove("SOFTRDMA_TRANSPORTS"),
    };
    match config {
        Some(path) => cmd.env("SOFTRDMA_CONFIG", path),
        None => cmd.env_remove("SOFTRDMA_CONFIG"),
    };
    cmd.output().expect("run softrdma")
}

/// A config file unique to this test, removed on drop.
struct TempConfig(PathBuf);

impl TempConfig {
    fn new(tag: &str, text: &str) -> TempConfig {
        let path = std::env::temp_dir().join(format!("softrdma-devices-cli-{}-{tag}.toml", std::process::id()));
        std::fs::write(&path, text).expect("write temp config");
        TempConfig(path)
    }
}

impl Drop for TempConfig {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn json_devices(out: &Output) -> Vec<Value> {
    assert!(
        out.status.success(),
        "softrdma failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    match serde_json::from_slice(&out.stdout).expect("stdout is JSON") {
        Value::Array(devices) => devices,
        other => panic!("expected a JSON array, got {other}"),
    }
}

#[test]
fn default_list_has_siw_lo_with_loopback() {
    let devices = json_devices(&softrdma(None, &["devices", "--json"]));
    let lo = devices
        .iter()
        .find(|d| d["name"] == "siw_lo")
        .expect("siw_lo is listed");
    assert_eq!(lo["transport"], "iwarp");
    assert_eq!(lo["netdev"], "lo");
    assert_eq!(lo["loopback"], true);
    assert_eq!(lo["loopback_reason"], Value::Null);
    assert_eq!(lo["port_state"], "ACTIVE");
    assert!(lo["ifindex"].as_u64().is_some_and(|i| i > 0));
    assert!(lo["mtu"].as_u64().is_some_and(|m| m > 0));
    let addrs = lo["addresses"].as_array().expect("addresses array");
    assert!(addrs.iter().any(|a| a == "127.0.0.1"), "{addrs:?}");
    assert_eq!(lo["gid0"].as_str().map(str::len), Some(39));
    assert_eq!(lo["node_guid"].as_str().map(str::len), Some(19));
    assert_eq!(devices[0]["name"], "siw_lo", "lo comes first");
}

#[test]
fn default_list_has_rxe_lo_after_siw_lo() {
    let devices = json_devices(&softrdma(None, &["devices", "--json"]));
    assert_eq!(devices[1]["name"], "rxe_lo", "siw then rxe per interface: {devices:?}");
    let rxe = &devices[1];
    assert_eq!(rxe["transport"], "roce");
    assert_eq!(rxe["netdev"], "lo");
    assert_eq!(rxe["loopback"], true);
    assert_eq!(rxe["port_state"], "ACTIVE");
    assert_eq!(rxe["gids"][0]["gid"], "::ffff:127.0.0.1");
    assert_eq!(rxe["gids"][0]["type"], "RoCE v2");
    assert_eq!(rxe["gid0"], "0000:0000:0000:0000:0000:ffff:7f00:0001");
    assert_ne!(rxe["node_guid"], devices[0]["node_guid"]);
    // Every interface has one device per transport, siw first.
    for pair in devices.chunks(2) {
        assert_eq!(pair.len(), 2, "{devices:?}");
        assert_eq!(pair[0]["transport"], "iwarp");
        assert_eq!(pair[1]["transport"], "roce");
        assert_eq!(pair[0]["netdev"], pair[1]["netdev"]);
    }
}

#[test]
fn verbose_table_lists_gids_with_types() {
    let out = softrdma(None, &["devices", "-v"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let line = text
        .lines()
        .find(|l| l.starts_with("rxe_lo ") && l.contains("GID[0]"))
        .unwrap_or_else(|| panic!("no rxe_lo GID[0] line:\n{text}"));
    assert!(line.ends_with("::ffff:127.0.0.1  RoCE v2"), "{line}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("siw_lo ") && l.contains("GID[0]") && l.ends_with("  IB")),
        "{text}"
    );
}

#[test]
fn transports_variable_filters_and_orders() {
    let devices = json_devices(&softrdma_env(None, Some("roce"), &["devices", "--json"]));
    assert!(!devices.is_empty());
    assert_eq!(devices[0]["name"], "rxe_lo");
    assert!(devices.iter().all(|d| d["transport"] == "roce"), "{devices:?}");
    let devices = json_devices(&softrdma_env(None, Some("roce,iwarp"), &["devices", "--json"]));
    assert_eq!(devices[0]["name"], "rxe_lo");
    assert_eq!(devices[1]["name"], "siw_lo");
    let out = softrdma_env(None, Some("roce,ib"), &["devices"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("SOFTRDMA_TRANSPORTS=\"roce,ib\""), "{err}");
    assert!(err.contains("unknown transport \"ib\""), "{err}");
    assert!(err.contains("iwarp, roce"), "{err}");
}

#[test]
fn table_lists_siw_lo() {
    let out = softrdma(None, &["devices"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let mut lines = text.lines();
    let header = lines.next().expect("header");
    for col in ["NAME", "TRANSPORT", "NETDEV", "ADDRESSES", "PORT", "MTU", "LOOPBACK"] {
        assert!(header.contains(col), "{header}");
    }
    let lo = lines.find(|l| l.starts_with("siw_lo ")).expect("siw_lo row");
    assert!(lo.contains("127.0.0.1") && lo.contains("ACTIVE") && lo.ends_with("yes"));
}

#[test]
fn config_replaces_the_list() {
    let cfg = TempConfig::new(
        "lo-no-loopback",
        "# one device only\n[[device]]\nname = \"siw_lo\"\ntransport = \"iwarp\"\n\
         netdev = \"lo\"\nloopback = false\n",
    );
    let devices = json_devices(&softrdma(Some(&cfg.0), &["devices", "--json"]));
    assert_eq!(devices.len(), 1, "{devices:?}");
    assert_eq!(devices[0]["name"], "siw_lo");
    assert_eq!(devices[0]["netdev"], "lo");
    assert_eq!(devices[0]["loopback"], false);
    assert_eq!(devices[0]["loopback_reason"], "loopback disabled by config");
    let table = softrdma(Some(&cfg.0), &["devices"]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(text.contains("no (loopback disabled by config)"), "{text}");
}

#[test]
fn broken_config_fails_naming_the_line() {
    let cfg = TempConfig::new(
        "unknown-key",
        "[[device]]\nname = \"siw_lo\"\ntransport = \"iwarp\"\nnetdev = \"lo\"\nloopbak = false\n",
    );
    let out = softrdma(Some(&cfg.0), &["devices", "--json"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("softrdma: "), "{err}");
    assert!(err.contains(&cfg.0.display().to_string()), "{err}");
    assert!(err.contains("line 5"), "{err}");
    assert!(err.contains("loopbak"), "{err}");
}

#[test]
fn unknown_netdev_fails_naming_the_line() {
    let cfg = TempConfig::new(
        "no-such-netdev",
        "[[device]]\nname = \"siw_lo\"\ntransport = \"iwarp\"\nnetdev = \"lo\"\n\n\
         [[device]]\nname = \"siw_x\"\ntransport = \"iwarp\"\nnetdev = \"softrdma-nx0\"\n",
    );
    let out = softrdma(Some(&cfg.0), &["devices"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 6"), "{err}");
    assert!(err.contains("softrdma-nx0"), "{err}");
}

#[test]
fn config_file_can_name_roce_devices() {
    let cfg = TempConfig::new(
        "roce",
        "[[device]]\nname = \"rxe_lo\"\ntransport = \"roce\"\nnetdev = \"lo\"\n",
    );
    // SOFTRDMA_TRANSPORTS does not filter a configured list.
    let devices = json_devices(&softrdma_env(Some(&cfg.0), Some("iwarp"), &["devices", "--json"]));
    assert_eq!(devices.len(), 1, "{devices:?}");
    assert_eq!(devices[0]["name"], "rxe_lo");
    assert_eq!(devices[0]["transport"], "roce");
    assert_eq!(devices[0]["gids"][0]["gid"], "::ffff:127.0.0.1");
}

/// `softrdma --help` lists every environment variable of the typed table, with its default.
#[test]
fn help_lists_every_environment_variable() {
    let out = softrdma(None, &["--help"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for v in softrdma_verbs::settings::ALL {
        assert!(
            text.contains(&format!("{}={}", v.name, v.value)),
            "{} missing:\n{text}",
            v.name
        );
        assert!(
            text.contains(&format!("[default: {}]", v.default)),
            "{} default missing",
            v.name
        );
    }
}
