//! The layout test: every struct/union declared with `c_struct!`/`c_union!` against the real
//! rdma-core headers. A C program (generated here, compiled with `cc`) prints `sizeof`,
//! `_Alignof`, and each field's `offsetof` and `sizeof`; every number must equal Rust's.
//!
//! Needs a C compiler and `libibverbs-dev` + `librdmacm-dev`; without them the test fails
//! saying so (it does not skip silently).

use std::fmt::Write as _;
use std::process::Command;

use super::TypeLayout;

fn all_layouts() -> Vec<TypeLayout> {
    let mut all = Vec::new();
    all.extend(super::verbs::verbs_structs());
    all.extend(super::verbs::verbs_unions());
    all.extend(super::cma::cma_structs());
    all.extend(super::cma::cma_unions());
    all.extend(super::kern::kern_structs());
    all
}

fn c_field_name(rust: &str) -> &str {
    rust.strip_prefix("r#").unwrap_or(rust)
}

fn c_program(layouts: &[TypeLayout]) -> String {
    let mut c = String::from(
        "#include <stddef.h>\n#include <stdio.h>\n#include <infiniband/verbs.h>\n\
         #include <infiniband/sa.h>\n#include <rdma/rdma_cma.h>\n\
         #include <rdma/ib_user_verbs.h>\n#include <rdma/ib_user_sa.h>\n\nint main(void)\n{\n",
    );
    for t in layouts.iter().filter(|t| !t.c_type.is_empty()) {
        let ty = t.c_type;
        writeln!(
            c,
            "\tprintf(\"T|{}|%zu|%zu\\n\", sizeof({ty}), _Alignof({ty}));",
            t.rust_name
        )
        .unwrap();
        for f in &t.fields {
            let name = c_field_name(f.name);
            writeln!(
                c,
                "\tprintf(\"F|{}|{name}|%zu|%zu\\n\", offsetof({ty}, {name}), sizeof((({ty} *)0)->{name}));",
                t.rust_name
            )
            .unwrap();
        }
    }
    c.push_str("\treturn 0;\n}\n");
    c
}

fn rust_lines(layouts: &[TypeLayout]) -> Vec<String> {
    let mut out = Vec::new();
    for t in layouts.iter().filter(|t| !t.c_type.is_empty()) {
        out.push(format!("T|{}|{}|{}", t.rust_name, t.size, t.align));
        for f in &t.fields {
            out.push(format!(
                "F|{}|{}|{}|{}",
                t.rust_name,
                c_field_name(f.name),
                f.offset,
                f.size
            ));
        }
    }
    out
}

#[test]
fn c_layout_matches_installed_headers() {
    let layouts = all_layouts();
    assert!(layouts.len() >= 60, "only {} types registered", layouts.len());

    let dir = std::env::temp_dir().join(format!("softrdma-capi-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("layout.c");
    let exe = dir.join("layout");
    std::fs::write(&src, c_program(&layouts)).unwrap();

    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    let build = Command::new(&cc)
        .args(["-std=gnu11", "-Wall", "-o"])
        .arg(&exe)
        .arg(&src)
        .output()
        .unwrap_or_else(|e| panic!("cannot run the C compiler `{cc}`: {e}"));
    assert!(
        build.status.success(),
        "compiling the layout probe failed (are libibverbs-dev and librdmacm-dev installed?):\n{}",
        String::from_utf8_lossy(&build.stderr)
    );
    let run = Command::new(&exe).output().unwrap();
    assert!(run.status.success());
    let c_out = String::from_utf8(run.stdout).unwrap();
    let c_lines: Vec<&str> = c_out.lines().collect();
    let rust = rust_lines(&layouts);

    let mismatches: Vec<String> = rust
        .iter()
        .zip(c_lines.iter())
        .filter(|(r, c)| r.as_str() != **c)
        .map(|(r, c)| format!("rust {r}  !=  C {c}"))
        .collect();
    assert_eq!(rust.len(), c_lines.len(), "line count differs");
    assert!(mismatches.is_empty(), "layout mismatches:\n{}", mismatches.join("\n"));
    let _ = std::fs::remove_dir_all(&dir);
}
