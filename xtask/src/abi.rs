//! `cargo xtask abi [--check]`: generates the drop-in's ABI tables from the installed rdma-core
//! libraries, never by hand.
//!
//! Inputs: `objdump -T` and `objdump -p` of Debian's `libibverbs.so.1`, `librdmacm.so.1`,
//! `libmlx5.so.1` and `libefa.so.1` (every exported function with its version, compat `@` or
//! default `@@`, and the version nodes with their parents), `objdump -T` of the consumers that
//! are installed (which `IBVERBS_PRIVATE_34` names applications import), and the prototypes in
//! `<infiniband/mlx5dv.h>`, `<infiniband/efadv.h>` and `<infiniband/verbs.h>` (preprocessed
//! by `cc -E`) for the return type of each generated stub.
//!
//! Outputs:
//! - `crates/capi/abi/exports.txt`: the version nodes and every `name@version` the drop-in
//!   must define (the build script derives the version script and the `.symver` table from it).
//! - `crates/capi/src/generated_stubs.rs`: the functions nobody implements by hand: every
//!   `libmlx5`/`libefa` function not in `vendor_dv.rs` ("not this device", as the real
//!   providers answer for a foreign device), and the `IBVERBS_1.0` / `IBVERBS_1.1` compat
//!   names of the pre-2006 ABI (different structure layouts: they fail with ENOSYS).
//!
//! `--check` compares instead of writing and fails when the files differ.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;

const LIBDIR: &str = "/usr/lib/x86_64-linux-gnu";
const LIBS: [&str; 4] = ["libibverbs.so.1", "librdmacm.so.1", "libmlx5.so.1", "libefa.so.1"];
/// Programs and modules whose `IBVERBS_PRIVATE_34` imports the drop-in must serve (the
/// private namespace is rdma-core's provider interface; only these few names reach
/// applications). Globs under `LIBDIR` or absolute; the ones not installed are skipped.
const CONSUMERS: &[&str] = &[
    "/usr/bin/ib_*",
    "/usr/bin/ibv_*",
    "/usr/bin/rping",
    "/usr/bin/ucmatose",
    "/usr/bin/udaddy",
    "/usr/bin/mckey",
    "/usr/bin/rdma_*",
    "/usr/bin/rstream",
    "/usr/bin/riostream",
    "/usr/bin/rcopy",
    "/usr/bin/cmtime",
    "/usr/lib/python3/dist-packages/pyverbs/*.so",
    "/usr/lib/python3/dist-packages/pyverbs/providers/*/*.so",
    "ucx/libuct_ib.so.0",
    "ucx/libuct_rdmacm.so.0",
    "openmpi/lib/openmpi3/mca_btl_openib.so",
    "libmca_common_verbs.so.40",
    "libfabric.so.1",
    "rsocket/librspreload.so",
];
/// Functions exported without a prototype in any installed header, with their C return type.
const NO_HEADER: &[(&str, &str)] = &[("ibv_register_driver", "void")];

pub fn run(args: &[String]) -> Result<(), String> {
    let check = match args {
        [] => false,
        [a] if a == "--check" => true,
        _ => return Err("usage: cargo xtask abi [--check]".into()),
    };
    let root = crate::workspace_root();
    let table = collect()?;
    let exports = render_exports(&table);
    let hand_written = hand_written_names(&root.join("crates/capi/src"))?;
    let stubs = render_stubs(&table, &hand_written)?;
    let outputs = [
        (root.join("crates/capi/abi/exports.txt"), exports),
        (root.join("crates/capi/src/generated_stubs.rs"), stubs),
    ];
    let mut stale = Vec::new();
    for (path, text) in &outputs {
        if check {
            let old = std::fs::read_to_string(path).unwrap_or_default();
            if old != *text {
                stale.push(path.display().to_string());
            }
        } else {
            std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            println!("wrote {}", path.display());
        }
    }
    if !stale.is_empty() {
        return Err(format!(
            "out of date with the installed rdma-core (run `cargo xtask abi`): {}",
            stale.join(", ")
        ));
    }
    Ok(())
}

/// One exported function version.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Export {
    lib: String,
    name: String,
    version: String,
    default: bool,
}

struct Table {
    /// `(lib, node, parent)` in the libraries' order.
    nodes: Vec<(String, String, Option<String>)>,
    exports: BTreeSet<Export>,
    /// Return type of each name that may need a stub.
    returns: BTreeMap<String, String>,
}

fn objdump(args: &[&str], path: &str) -> Result<String, String> {
    let out = Command::new("objdump")
        .args(args)
        .arg(path)
        .output()
        .map_err(|e| format!("cannot run objdump (binutils): {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "objdump {args:?} {path} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `(version, name, hidden)` of each dynamic function symbol in `objdump -T` output: defined
/// ones when `undefined` is false, imported ones otherwise.
fn dynamic_functions(text: &str, undefined: bool) -> Vec<(String, String, bool)> {
    let mut v = Vec::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 4 {
            continue;
        }
        let (Some(name), Some(ver)) = (f.last(), f.get(f.len() - 2)) else {
            continue;
        };
        let is_undef = line.contains("*UND*");
        if is_undef != undefined || !undefined && !line.contains(" DF ") {
            continue;
        }
        let hidden = ver.starts_with('(');
        let ver = ver.trim_matches(|c| c == '(' || c == ')');
        if ver.starts_with("IBVERBS_")
            || ver.starts_with("RDMACM_")
            || ver.starts_with("MLX5_")
            || ver.starts_with("EFA_")
        {
            v.push((ver.to_owned(), (*name).to_owned(), hidden));
        }
    }
    v
}

fn version_nodes(lib: &str, text: &str) -> Vec<(String, String, Option<String>)> {
    let mut nodes: Vec<(String, String, Option<String>)> = Vec::new();
    let mut inside = false;
    for line in text.lines() {
        if line.starts_with("Version definitions:") {
            inside = true;
            continue;
        }
        if !inside {
            continue;
        }
        if line.trim().is_empty() || line.starts_with("Version References") {
            break;
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        if line.starts_with('\t') || line.starts_with(' ') && f.len() == 1 {
            if let (Some(last), Some(parent)) = (nodes.last_mut(), f.first()) {
                last.2 = Some((*parent).to_owned());
            }
        } else if f.len() == 4 && f[1] != "0x01" {
            nodes.push((lib.to_owned(), f[3].to_owned(), None));
        }
    }
    nodes
}

fn consumer_paths() -> Vec<String> {
    let mut paths = Vec::new();
    for pat in CONSUMERS {
        let full = if pat.starts_with('/') {
            (*pat).to_owned()
        } else {
            format!("{LIBDIR}/{pat}")
        };
        let (dir, file) = full.rsplit_once('/').unwrap_or((".", &full));
        let dirs: Vec<String> = if let Some((base, rest)) = dir.split_once("/*") {
            // one level of directory glob (pyverbs/providers/*)
            std::fs::read_dir(base)
                .map(|rd| rd.flatten().map(|e| format!("{}{rest}", e.path().display())).collect())
                .unwrap_or_default()
        } else {
            vec![dir.to_owned()]
        };
        for d in dirs {
            let Ok(rd) = std::fs::read_dir(&d) else { continue };
            let mut names: Vec<String> = rd
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            for n in names {
                if glob_match(file, &n) {
                    paths.push(format!("{d}/{n}"));
                }
            }
        }
    }
    paths
}

fn glob_match(pat: &str, name: &str) -> bool {
    match pat.split_once('*') {
        None => pat == name,
        Some((pre, post)) => name.len() >= pre.len() + post.len() && name.starts_with(pre) && name.ends_with(post),
    }
}

fn collect() -> Result<Table, String> {
    let mut nodes = Vec::new();
    let mut exports = BTreeSet::new();
    for lib in LIBS {
        let path = format!("{LIBDIR}/{lib}");
        if !Path::new(&path).exists() {
            return Err(format!(
                "{path} is not installed (apt-get install libibverbs1 librdmacm1 ibverbs-providers)"
            ));
        }
        nodes.extend(version_nodes(lib, &objdump(&["-p"], &path)?));
        for (version, name, hidden) in dynamic_functions(&objdump(&["-T"], &path)?, false) {
            if version.ends_with("_PRIVATE_34") {
                continue;
            }
            exports.insert(Export {
                lib: lib.to_owned(),
                name,
                version,
                default: !hidden,
            });
        }
    }
    let private: BTreeSet<String> = consumer_paths()
        .iter()
        .filter_map(|p| objdump(&["-T"], p).ok())
        .flat_map(|t| dynamic_functions(&t, true))
        .filter(|(v, _, _)| v == "IBVERBS_PRIVATE_34")
        .map(|(_, n, _)| n)
        .collect();
    for name in private {
        exports.insert(Export {
            lib: "libibverbs.so.1".into(),
            name,
            version: "IBVERBS_PRIVATE_34".into(),
            default: true,
        });
    }
    if !nodes.iter().any(|(_, n, _)| n == "IBVERBS_PRIVATE_34") {
        nodes.push(("libibverbs.so.1".into(), "IBVERBS_PRIVATE_34".into(), None));
    }
    Ok(Table {
        nodes,
        exports,
        returns: prototypes()?,
    })
}

fn render_exports(t: &Table) -> String {
    let mut s = String::from(
        "# generated by `cargo xtask abi` from the installed rdma-core libraries: do not edit\n\
         # node <library> <version node> <parent or ->\n\
         # fn <library> <name> <version> <default|compat>\n",
    );
    for (lib, node, parent) in &t.nodes {
        let _ = writeln!(s, "node {lib} {node} {}", parent.as_deref().unwrap_or("-"));
    }
    for e in &t.exports {
        let _ = writeln!(
            s,
            "fn {} {} {} {}",
            e.lib,
            e.name,
            e.version,
            if e.default { "default" } else { "compat" }
        );
    }
    s
}

/// Names defined by `c_fn!` blocks in the crate's hand-written sources.
fn hand_written_names(src: &Path) -> Result<BTreeSet<String>, String> {
    let mut names = BTreeSet::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let rd = std::fs::read_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") && !p.ends_with("generated_stubs.rs") {
                let text = std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?;
                for line in text.lines() {
                    let l = line.trim_start();
                    if let Some(rest) = l.strip_prefix("fn ") {
                        if let Some(name) = rest.split('(').next() {
                            names.insert(name.trim().to_owned());
                        }
                    }
                }
            }
        }
    }
    Ok(names)
}

/// Return types of the functions declared in the installed headers, by name.
fn prototypes() -> Result<BTreeMap<String, String>, String> {
    let tu = "#include <infiniband/verbs.h>\n#include <infiniband/mlx5dv.h>\n#include <infiniband/efadv.h>\n";
    let dir = std::env::temp_dir().join(format!("softrdma-xtask-abi-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let c = dir.join("abi.c");
    std::fs::write(&c, tu).map_err(|e| e.to_string())?;
    let out = Command::new("cc")
        .args(["-E", "-P", "-D_GNU_SOURCE"])
        .arg(&c)
        .output()
        .map_err(|e| format!("cannot run cc: {e}"))?;
    let _ = std::fs::remove_dir_all(&dir);
    if !out.status.success() {
        return Err(format!(
            "cc -E of the rdma-core headers failed (apt-get install libibverbs-dev): {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    let text = strip_attributes(&String::from_utf8_lossy(&out.stdout));
    let mut map = BTreeMap::new();
    for decl in top_level_statements(&text) {
        let Some(open) = decl.find('(') else { continue };
        let head = decl[..open].trim_end();
        let name_start = head
            .rfind(|c: char| !(c.is_alphanumeric() || c == '_'))
            .map_or(0, |i| i + 1);
        let name = &head[name_start..];
        let ret = head[..name_start].trim();
        if name.is_empty() || ret.is_empty() || ret.starts_with("typedef") || ret.contains('=') {
            continue;
        }
        let ret = ret
            .split_whitespace()
            .filter(|w| !matches!(*w, "extern" | "static" | "inline" | "__inline" | "__inline__"))
            .collect::<Vec<_>>()
            .join(" ");
        map.entry(name.to_owned()).or_insert(ret);
    }
    for (name, ret) in NO_HEADER {
        map.entry((*name).to_owned()).or_insert_with(|| (*ret).to_owned());
    }
    Ok(map)
}

/// Removes `__attribute__((...))` and `__extension__`.
fn strip_attributes(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("__attribute__") {
        out.push_str(&rest[..i]);
        rest = &rest[i + "__attribute__".len()..];
        let mut depth = 0usize;
        let mut end = 0;
        for (j, ch) in rest.char_indices() {
            match ch {
                '(' => depth += 1,
                ')' => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        end = j + 1;
                        break;
                    }
                }
                c if depth == 0 && !c.is_whitespace() => break,
                _ => {}
            }
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    out.replace("__extension__", "")
}

/// The statements at brace depth 0 (function bodies and struct bodies are skipped), each the
/// text since the previous `;` or closing brace, whitespace-normalised.
fn top_level_statements(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut depth = 0usize;
    for ch in text.chars() {
        match ch {
            '{' => {
                if depth == 0 {
                    // a function definition's or a type's head is a statement too
                    out.push(normalise(&cur));
                    cur.clear();
                }
                depth += 1;
            }
            '}' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    cur.clear();
                }
            }
            ';' if depth == 0 => {
                out.push(normalise(&cur));
                cur.clear();
            }
            c if depth == 0 => cur.push(c),
            _ => {}
        }
    }
    out
}

fn normalise(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// How a stub answers, from the C return type.
fn return_kind(ret: &str) -> &'static str {
    if ret.contains('*') {
        "ptr"
    } else if ret == "void" {
        "void"
    } else if ret == "bool" || ret == "_Bool" {
        "bool"
    } else if ret.starts_with("struct ") || ret.starts_with("union ") {
        "aggregate"
    } else {
        "int"
    }
}

fn render_stubs(t: &Table, hand_written: &BTreeSet<String>) -> Result<String, String> {
    let mut s = String::from(
        "// @generated by `cargo xtask abi` from the installed rdma-core libraries and headers: do not edit.\n\
         //! The exported functions nobody implements by hand, each answering as the real library\n\
         //! does where the feature cannot apply:\n\
         //! - `libmlx5.so.1` / `libefa.so.1` direct verbs not in `vendor_dv.rs`: a softrdma device\n\
         //!   is neither, so each fails as the real provider does for a foreign device (NULL or the\n\
         //!   value EOPNOTSUPP, with `errno = EOPNOTSUPP`; `false` from a `bool` probe such as\n\
         //!   `mlx5dv_is_supported`; nothing for `void`).\n\
         //! - the compat names of libibverbs' pre-2006 ABI (`IBVERBS_1.0`, and `ibv_register_driver`\n\
         //!   of the old provider interface): their structures have other layouts, so each fails with\n\
         //!   `errno = ENOSYS` and says so once. Binaries built since 2006 bind the default versions.\n\
         //!\n\
         //! The stubs read none of their arguments, so they declare none: under the System V x86-64\n\
         //! calling convention the caller owns the argument registers and the stack.\n\n\
         use std::ffi::{c_int, c_void};\n\n\
         use crate::error::{compat_abi_unsupported, not_this_device};\n\n",
    );
    let mut by_name: BTreeMap<&str, Vec<&Export>> = BTreeMap::new();
    for e in &t.exports {
        by_name.entry(&e.name).or_default().push(e);
    }
    for (name, versions) in &by_name {
        let lib = &versions[0].lib;
        let vendor = lib == "libmlx5.so.1" || lib == "libefa.so.1";
        let stubs: Vec<&&Export> = if vendor {
            if hand_written.contains(*name) {
                continue;
            }
            versions.iter().collect()
        } else {
            versions
                .iter()
                .filter(|e| !e.default && e.version != "IBVERBS_PRIVATE_34")
                .collect()
        };
        if stubs.is_empty() {
            continue;
        }
        let ret = t
            .returns
            .get(*name)
            .ok_or_else(|| format!("no prototype of {name} in the installed headers"))?;
        let kind = return_kind(ret);
        if kind == "aggregate" {
            return Err(format!("{name} returns {ret} by value: write it by hand"));
        }
        let (rust_ret, body) = match (vendor, kind) {
            (true, "ptr") => (
                " -> *mut c_void",
                format!("not_this_device(\"{name}\", \"{lib}\");\n        std::ptr::null_mut()"),
            ),
            (true, "int") => (" -> c_int", format!("not_this_device(\"{name}\", \"{lib}\")")),
            (true, "bool") => (" -> bool", "false".to_owned()),
            (true, _) => ("", format!("not_this_device(\"{name}\", \"{lib}\");")),
            (false, "ptr") => (
                " -> *mut c_void",
                format!("compat_abi_unsupported(\"{name}\");\n        std::ptr::null_mut()"),
            ),
            (false, "int") => (" -> c_int", format!("compat_abi_unsupported(\"{name}\");\n        -1")),
            (false, "bool") => (
                " -> bool",
                format!("compat_abi_unsupported(\"{name}\");\n        false"),
            ),
            (false, _) => ("", format!("compat_abi_unsupported(\"{name}\");")),
        };
        let ident = if vendor {
            (*name).to_owned()
        } else {
            format!("{name}_compat_abi")
        };
        let _ = writeln!(
            s,
            "/// `{ret} {name}(...)`: {}.",
            if vendor { "not this device" } else { "the pre-2006 ABI" }
        );
        let _ = writeln!(s, "#[cfg_attr(test, allow(dead_code))]");
        let _ = writeln!(s, "extern \"C\" fn {ident}(){rust_ret} {{\n    crate::error::guard(\"{name}\", || {{\n        {body}\n    }})\n}}");
        let mut asm = String::new();
        for e in &stubs {
            let at = if e.default { "@@" } else { "@" };
            let _ = write!(asm, "\n    \".symver {{f}}, {name}{at}{}\",", e.version);
        }
        let _ = writeln!(
            s,
            "#[cfg(not(test))]\n::core::arch::global_asm!(\n    \".globl {{f}}\",{asm}\n    f = sym {ident},\n);\n"
        );
    }
    // keep the imports used whatever the table holds
    s.push_str("#[allow(dead_code)]\nconst _USES: (Option<c_int>, Option<*const c_void>) = (None, None);\n");
    Ok(s)
}

#[cfg(test)]
mod tests {
    /// The checked-in tables are what the installed rdma-core gives (CI installs it; a
    /// machine without it fails here saying what to install).
    #[test]
    fn the_checked_in_tables_match_the_installed_rdma_core() {
        if let Err(e) = super::run(&["--check".to_owned()]) {
            panic!("{e}");
        }
    }
}
