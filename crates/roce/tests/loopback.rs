//! soft-RoCE over real UDP sockets on 127.0.0.1: RC and UD QPs in this process, and a QP in a
//! child process (which exercises the cross-process forwarding of the driver).

use softrdma_roce::driver::{create_qp, driver_stats};
use softrdma_verbs::qp_state::attr_mask::*;
use softrdma_verbs::*;
use std::time::Duration;

struct Side {
    pd: Pd,
    cq: Cq,
    qp: Qp,
    /// The CQ's completion channel, if it has one.
    cc: Option<CompChannel>,
}

fn rxe_lo() -> device::DeviceInfo {
    device::find_device("rxe_lo").unwrap_or_else(|e| panic!("{e}"))
}

fn side(qp_type: QpType) -> Side {
    side_with(qp_type, false)
}

/// A side whose CQ has a completion channel if `events`.
fn side_with(qp_type: QpType, events: bool) -> Side {
    let ctx = Context::open(&rxe_lo()).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cc = events.then(|| ctx.create_comp_channel().unwrap());
    let cq = ctx.create_cq(4096, cc.as_ref()).unwrap();
    let init = QpInitAttr {
        send_cq: cq.clone(),
        recv_cq: cq.clone(),
        srq: None,
        cap: QpCap {
            max_send_wr: 512,
            max_recv_wr: 512,
            max_send_sge: 4,
            max_recv_sge: 4,
            max_inline_data: 64,
        },
        qp_type,
        sq_sig_all: false,
    };
    let qp = create_qp(&pd, init).unwrap();
    let mut a = QpAttr {
        qp_state: Some(QpState::Init),
        pkey_index: 0,
        port_num: 1,
        qp_access_flags: Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
        ..QpAttr::default()
    };
    let mask = if qp_type == QpType::Ud {
        a.qkey = 0x1111_1111;
        STATE | PKEY_INDEX | PORT | QKEY
    } else {
        STATE | PKEY_INDEX | PORT | ACCESS_FLAGS
    };
    qp.modify(&a, mask).unwrap();
    Side { pd, cq, qp, cc }
}

fn lo_gid() -> [u8; 16] {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&[127, 0, 0, 1]);
    g
}

/// The GID of `::1` and its index in rxe_lo's table.
fn lo6() -> ([u8; 16], u8) {
    let ip: std::net::IpAddr = "::1".parse().unwrap();
    let idx = rxe_lo().gid_index_of(ip).expect("rxe_lo has ::1 in its GID table");
    (device::Gid::from_ip(ip).0, idx as u8)
}

/// The address both sides use: `SOFTRDMA_TEST_IPV6=1` picks `::1`, else 127.0.0.1 (GID 0).
fn test_gid() -> ([u8; 16], u8) {
    if std::env::var_os("SOFTRDMA_TEST_IPV6").is_some() {
        lo6()
    } else {
        (lo_gid(), 0)
    }
}

fn connect_rc(s: &Side, remote_qpn: u32, sq_psn: u32, rq_psn: u32) {
    let (dgid, sgid_index) = test_gid();
    connect_rc_to(s, remote_qpn, sq_psn, rq_psn, dgid, sgid_index)
}

fn connect_rc_to(s: &Side, remote_qpn: u32, sq_psn: u32, rq_psn: u32, dgid: [u8; 16], sgid_index: u8) {
    let rtr = QpAttr {
        qp_state: Some(QpState::Rtr),
        path_mtu: 3,
        dest_qp_num: remote_qpn,
        rq_psn,
        max_dest_rd_atomic: 4,
        min_rnr_timer: 1,
        ah_attr: AhAttr {
            dgid,
            sgid_index,
            is_global: true,
            hop_limit: 64,
            port_num: 1,
            ..AhAttr::default()
        },
        ..QpAttr::default()
    };
    s.qp.modify(
        &rtr,
        STATE | AV | PATH_MTU | DEST_QPN | RQ_PSN | MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER,
    )
    .unwrap();
    let rts = QpAttr {
        qp_state: Some(QpState::Rts),
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        sq_psn,
        max_rd_atomic: 4,
        ..QpAttr::default()
    };
    s.qp.modify(
        &rts,
        STATE | TIMEOUT | RETRY_CNT | RNR_RETRY | SQ_PSN | MAX_QP_RD_ATOMIC,
    )
    .unwrap();
}

fn wait(cq: &Cq, n: usize) -> Vec<WorkCompletion> {
    let got = cq.wait_for(n, Duration::from_secs(20));
    assert_eq!(got.len(), n, "timed out waiting for {n} completions, got {got:?}");
    for wc in &got {
        assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
    }
    got
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn rc_send_write_read_atomic_in_one_process() {
    let a = side(QpType::Rc);
    let b = side(QpType::Rc);
    connect_rc(&a, b.qp.qpn(), 100, 0xff_fff0);
    connect_rc(&b, a.qp.qpn(), 0xff_fff0, 100);
    let len = 300_000;
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC;
    let src = a.pd.alloc_mr(len, all).unwrap();
    let dst = b.pd.alloc_mr(len, all).unwrap();
    let data = pattern(len, 7);
    src.write(0, &data).unwrap();

    // SEND of several MTUs into a posted RECV.
    b.qp.post_recv_one(1, dst.sge(0, len as u32)).unwrap();
    a.qp.post_send_one(SendWr::send(2, vec![src.sge(0, 20_000)])).unwrap();
    wait(&a.cq, 1);
    let r = wait(&b.cq, 1);
    assert_eq!(r[0].byte_len, 20_000);
    assert_eq!(&dst.to_vec()[..20_000], &data[..20_000]);

    // WRITE the whole buffer, READ it back into the source at an offset.
    a.qp.post_send_one(SendWr::write(3, vec![src.sge(0, len as u32)], dst.addr(), dst.rkey()))
        .unwrap();
    wait(&a.cq, 1);
    assert_eq!(dst.to_vec(), data);
    let back = a.pd.alloc_mr(len, all).unwrap();
    a.qp.post_send_one(SendWr::read(4, vec![back.sge(0, len as u32)], dst.addr(), dst.rkey()))
        .unwrap();
    wait(&a.cq, 1);
    assert_eq!(back.to_vec(), data);

    // Fetch-and-add on the target's first 8 bytes.
    let before = u64::from_ne_bytes(data[..8].try_into().unwrap());
    let wr = SendWr {
        wr_id: 5,
        opcode: Some(WrOpcode::AtomicFetchAndAdd),
        sg_list: vec![back.sge(0, 8)],
        flags: SendFlags::SIGNALED,
        remote_addr: dst.addr(),
        rkey: dst.rkey(),
        compare_add: 5,
        ..SendWr::default()
    };
    a.qp.post_send_one(wr).unwrap();
    wait(&a.cq, 1);
    assert_eq!(u64::from_ne_bytes(back.to_vec()[..8].try_into().unwrap()), before);
    assert_eq!(
        u64::from_ne_bytes(dst.to_vec()[..8].try_into().unwrap()),
        before.wrapping_add(5)
    );

    // A bad rkey fails with a remote access error and leaves the target alone.
    let snapshot = dst.to_vec();
    a.qp.post_send_one(SendWr::write(6, vec![src.sge(0, 64)], dst.addr(), dst.rkey() ^ 0x100))
        .unwrap();
    let wc = a.cq.wait_for(1, Duration::from_secs(20));
    assert_eq!(wc.len(), 1);
    assert_eq!(wc[0].status, WcStatus::RemAccessErr, "{:?}", wc[0]);
    assert_eq!(dst.to_vec(), snapshot);
    let st = driver_stats();
    assert!(st.tx_datagrams > 0 && st.rx_datagrams > 0, "{st:?}");
    assert_eq!(st.icrc_errors, 0, "{st:?}");
}

#[test]
fn rc_over_ipv6_loopback() {
    let (gid, idx) = lo6();
    let a = side(QpType::Rc);
    let b = side(QpType::Rc);
    connect_rc_to(&a, b.qp.qpn(), 5, 6, gid, idx);
    connect_rc_to(&b, a.qp.qpn(), 6, 5, gid, idx);
    let len = 100_000;
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    let src = a.pd.alloc_mr(len, all).unwrap();
    let dst = b.pd.alloc_mr(len, all).unwrap();
    let data = pattern(len, 21);
    src.write(0, &data).unwrap();
    let before = driver_stats();
    b.qp.post_recv_one(1, dst.sge(0, len as u32)).unwrap();
    a.qp.post_send_one(SendWr::send(2, vec![src.sge(0, len as u32)]))
        .unwrap();
    wait(&a.cq, 1);
    assert_eq!(wait(&b.cq, 1)[0].byte_len, len as u32);
    assert_eq!(dst.to_vec(), data);
    let back = a.pd.alloc_mr(len, all).unwrap();
    a.qp.post_send_one(SendWr::read(3, vec![back.sge(0, len as u32)], dst.addr(), dst.rkey()))
        .unwrap();
    wait(&a.cq, 1);
    assert_eq!(back.to_vec(), data);
    let st = driver_stats();
    assert!(st.rx_datagrams > before.rx_datagrams, "{st:?}");
    assert_eq!(st.icrc_errors, before.icrc_errors, "IPv6 ICRCs check: {st:?}");
    assert_eq!(st.unsupported, before.unsupported, "{st:?}");
}

#[test]
fn rc_rtr_refuses_a_family_mismatch() {
    let (gid6, _) = lo6();
    let a = side(QpType::Rc);
    let rtr = QpAttr {
        qp_state: Some(QpState::Rtr),
        path_mtu: 3,
        dest_qp_num: 0x12_3401,
        ah_attr: AhAttr {
            dgid: gid6,
            sgid_index: 0,
            is_global: true,
            hop_limit: 64,
            port_num: 1,
            ..AhAttr::default()
        },
        ..QpAttr::default()
    };
    let e =
        a.qp.modify(
            &rtr,
            STATE | AV | PATH_MTU | DEST_QPN | RQ_PSN | MAX_DEST_RD_ATOMIC | MIN_RNR_TIMER,
        )
        .unwrap_err();
    assert_eq!(e.errno, Errno::Inval, "{e}");
}

#[test]
fn ud_over_ipv6_with_grh() {
    let (gid, idx) = lo6();
    let a = side(QpType::Ud);
    let b = side(QpType::Ud);
    for s in [&a, &b] {
        s.qp.modify(
            &QpAttr {
                qp_state: Some(QpState::Rtr),
                ..QpAttr::default()
            },
            STATE,
        )
        .unwrap();
        s.qp.modify(
            &QpAttr {
                qp_state: Some(QpState::Rts),
                ..QpAttr::default()
            },
            STATE | SQ_PSN,
        )
        .unwrap();
    }
    let buf = b.pd.alloc_mr(4096 + 40, Access::LOCAL_WRITE).unwrap();
    let src = a.pd.alloc_mr(500, Access::LOCAL_WRITE).unwrap();
    src.write(0, &pattern(500, 5)).unwrap();
    b.qp.post_recv_one(1, buf.sge(0, 4096 + 40)).unwrap();
    let ah = AhAttr {
        dgid: gid,
        sgid_index: idx,
        is_global: true,
        hop_limit: 17,
        traffic_class: 0x20,
        port_num: 1,
        ..AhAttr::default()
    };
    let wr = SendWr {
        ud: Some(UdDest {
            ah,
            remote_qpn: b.qp.qpn(),
            remote_qkey: 0x1111_1111,
        }),
        ..SendWr::send(9, vec![src.sge(0, 500)])
    };
    a.qp.post_send_one(wr).unwrap();
    wait(&a.cq, 1);
    let r = wait(&b.cq, 1);
    assert_eq!(r[0].byte_len, 540);
    assert_eq!(r[0].src_qp, a.qp.qpn());
    assert_ne!(r[0].wc_flags & wr::wc_flags::GRH, 0);
    let got = buf.to_vec();
    assert_eq!(got[0] >> 4, 6, "the GRH holds the IPv6 header");
    let tclass = ((u32::from_be_bytes([got[0], got[1], got[2], got[3]]) >> 20) & 0xff) as u8;
    assert_eq!(tclass, 0x20, "traffic class from the address handle, on the wire");
    assert_eq!(got[6], 17, "next header UDP");
    assert_eq!(got[7], 17, "hop limit from the address handle");
    assert_eq!(&got[8..24], &gid, "source ::1");
    assert_eq!(&got[24..40], &gid, "destination ::1");
    assert_eq!(&got[40..540], &pattern(500, 5)[..]);
}

#[test]
fn ud_send_with_grh() {
    let a = side(QpType::Ud);
    let b = side(QpType::Ud);
    for s in [&a, &b] {
        let rtr = QpAttr {
            qp_state: Some(QpState::Rtr),
            ..QpAttr::default()
        };
        s.qp.modify(&rtr, STATE).unwrap();
        let rts = QpAttr {
            qp_state: Some(QpState::Rts),
            sq_psn: 0,
            ..QpAttr::default()
        };
        s.qp.modify(&rts, STATE | SQ_PSN).unwrap();
    }
    let buf = b.pd.alloc_mr(4096 + 40, Access::LOCAL_WRITE).unwrap();
    let src = a.pd.alloc_mr(1000, Access::LOCAL_WRITE).unwrap();
    src.write(0, &pattern(1000, 3)).unwrap();
    b.qp.post_recv_one(1, buf.sge(0, 4096 + 40)).unwrap();
    let ah = AhAttr {
        dgid: lo_gid(),
        is_global: true,
        hop_limit: 64,
        port_num: 1,
        ..AhAttr::default()
    };
    let wr = SendWr {
        ud: Some(UdDest {
            ah,
            remote_qpn: b.qp.qpn(),
            remote_qkey: 0x1111_1111,
        }),
        ..SendWr::send(9, vec![src.sge(0, 1000)])
    };
    a.qp.post_send_one(wr).unwrap();
    wait(&a.cq, 1);
    let r = wait(&b.cq, 1);
    assert_eq!(r[0].byte_len, 1040);
    assert_eq!(r[0].src_qp, a.qp.qpn());
    assert_ne!(r[0].wc_flags & wr::wc_flags::GRH, 0);
    let got = buf.to_vec();
    assert_eq!(got[20] >> 4, 4, "IPv4 header at byte 20 of the GRH");
    assert_eq!(&got[32..36], &[127, 0, 0, 1]);
    assert_eq!(&got[40..1040], &pattern(1000, 3)[..]);
}

/// Runs in a child process (see `rc_between_two_processes`): a QP that receives one SEND and
/// answers with the bytes' checksum, then WRITEs them back into the parent's buffer.
fn child_main() {
    use std::io::{BufRead, Write};
    let s = side(QpType::Rc);
    let mut out = std::io::stdout();
    writeln!(out, "qpn {}", s.qp.qpn()).unwrap();
    out.flush().unwrap();
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).unwrap();
    let f: Vec<u64> = line.split_whitespace().skip(1).map(|v| v.parse().unwrap()).collect();
    let (peer_qpn, addr, rkey, len) = (f[0] as u32, f[1], f[2] as u32, f[3] as usize);
    let mr = s.pd.alloc_mr(len, Access::LOCAL_WRITE).unwrap();
    s.qp.post_recv_one(1, mr.sge(0, len as u32)).unwrap();
    connect_rc(&s, peer_qpn, 7, 9);
    writeln!(out, "ready").unwrap();
    out.flush().unwrap();
    wait(&s.cq, 1);
    let data = mr.to_vec();
    let sum: u64 = data.iter().map(|&b| b as u64).sum();
    s.qp.post_send_one(SendWr::write(2, vec![mr.sge(0, len as u32)], addr, rkey))
        .unwrap();
    wait(&s.cq, 1);
    writeln!(out, "sum {sum}").unwrap();
    out.flush().unwrap();
}

#[test]
fn rc_between_two_processes() {
    if std::env::var_os("SOFTRDMA_ROCE_CHILD").is_some() {
        return child_main();
    }
    two_processes("rc_between_two_processes", false, false);
}

/// The same, the parent waiting for its SEND's completion blocked in `get_cq_event`: that
/// thread takes the UDP sockets from the progress thread while it waits (see the driver's
/// `hold` module), and must let it have them back. The child's WRITE comes after, while no
/// thread of the parent calls into verbs: only the progress thread can place and acknowledge
/// it (else the child's WRITE times out).
#[test]
fn rc_between_two_processes_after_a_blocked_wait() {
    if std::env::var_os("SOFTRDMA_ROCE_CHILD").is_some() {
        return child_main();
    }
    two_processes("rc_between_two_processes_after_a_blocked_wait", false, true);
}

#[test]
fn rc_between_two_processes_over_ipv6() {
    if std::env::var_os("SOFTRDMA_ROCE_CHILD").is_some() {
        return child_main();
    }
    two_processes("rc_between_two_processes_over_ipv6", true, false);
}

/// The parent side of a two-process RC test (`name` re-runs this test as the child) over
/// 127.0.0.1 or `::1`; `blocked`: it waits for its completion in `get_cq_event`.
fn two_processes(name: &str, ipv6: bool, blocked: bool) {
    use std::io::{BufRead, BufReader, Write};
    use std::process::{Command, Stdio};
    let exe = std::env::current_exe().unwrap();
    let mut cmd = Command::new(exe);
    cmd.args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env("SOFTRDMA_ROCE_CHILD", "1");
    if ipv6 {
        cmd.env("SOFTRDMA_TEST_IPV6", "1");
    }
    let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    struct Reap(std::process::Child);
    impl Drop for Reap {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let mut child = Reap(child);
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for l in BufReader::new(stdout).lines().map_while(|l| l.ok()) {
            let _ = tx.send(l);
        }
    });
    let next = |prefix: &str| -> String {
        loop {
            match rx.recv_timeout(Duration::from_secs(30)) {
                // libtest's "test name ... " has no newline, so a line may start with it.
                Ok(l) => {
                    if let Some(at) = l.find(prefix) {
                        return l[at + prefix.len()..].trim().to_string();
                    }
                }
                Err(e) => panic!("no {prefix:?} line from the child ({e}); parent {:?}", driver_stats()),
            }
        }
    };
    let peer: u32 = next("qpn ").parse().unwrap();
    let s = side_with(QpType::Rc, blocked);
    let len = 200_000usize;
    let all = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let src = s.pd.alloc_mr(len, all).unwrap();
    let back = s.pd.alloc_mr(len, all).unwrap();
    let data = pattern(len, 11);
    src.write(0, &data).unwrap();
    if ipv6 {
        let (gid, idx) = lo6();
        connect_rc_to(&s, peer, 9, 7, gid, idx);
    } else {
        connect_rc(&s, peer, 9, 7);
    }
    writeln!(stdin, "peer {} {} {} {len}", s.qp.qpn(), back.addr(), back.rkey()).unwrap();
    stdin.flush().unwrap();
    next("ready");
    if s.cc.is_some() {
        s.cq.req_notify(false).unwrap();
    }
    s.qp.post_send_one(SendWr::send(1, vec![src.sge(0, len as u32)]))
        .unwrap();
    match &s.cc {
        Some(cc) => {
            let cq = cc
                .get_cq_event(Some(Duration::from_secs(20)))
                .expect("the SEND's completion event");
            cq.ack_events(1);
            wait(&s.cq, 1);
        }
        None => {
            wait(&s.cq, 1);
        }
    }
    let sum: u64 = next("sum ").parse().unwrap();
    assert_eq!(sum, data.iter().map(|&b| b as u64).sum::<u64>());
    assert_eq!(back.to_vec(), data, "the child's WRITE brought the bytes back");
    let status = child.0.wait().unwrap();
    assert!(status.success());
}
