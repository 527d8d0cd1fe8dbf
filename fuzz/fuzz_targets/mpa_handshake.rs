//! The MPA connection setup (softrdma_iwarp::handshake) on hostile bytes.
//!
//! - `parse_request` and `parse_reply` (with several local parameter sets) on the raw input;
//! - `build_accept` on every request that parses, and the reply it builds must be accepted
//!   by `parse_reply` on the initiator with a consistent negotiation (CRC, RTR, revision,
//!   private data, IRD/ORD bounds);
//! - encode-first: a request built from input-derived parameters goes through the whole
//!   request -> accept/reject -> reply exchange.
#![no_main]

use libfuzzer_sys::fuzz_target;
use softrdma_iwarp::handshake::{
    build_accept, build_reject, build_request, parse_reply, parse_request, MpaParams, Negotiated, ReplyOutcome,
};
use softrdma_verbs::Errno;
use softrdma_wire::{MpaFrame, MpaKind, MPA_MAX_PD_LEN};

fn params(pd_len: usize, ird: u32, ord: u32, crc: bool) -> MpaParams {
    MpaParams {
        private_data: (0..pd_len).map(|i| i as u8 ^ 0x5a).collect(),
        ird,
        ord,
        crc,
        p2p: false,
    }
}

/// Local parameter sets: small, the largest enhanced private data, revision-1-forcing
/// private data with absurd IRD/ORD, the 512-byte limit.
fn variants() -> [MpaParams; 4] {
    [
        params(0, 4, 4, false),
        params(MPA_MAX_PD_LEN - 4, 0, 0, true),
        params(MPA_MAX_PD_LEN - 3, u32::MAX, u32::MAX, false),
        params(MPA_MAX_PD_LEN, 1, 0x4000, true),
    ]
}

fn clamp14(v: u32) -> u32 {
    v.clamp(1, 0x3fff)
}

/// The initiator's reading of a reply, checked against what the frame says.
fn check_reply(data: &[u8], ours: &MpaParams) -> Option<(ReplyOutcome, usize)> {
    let frame = MpaFrame::parse(data);
    match parse_reply(data, ours) {
        Ok(None) => {
            assert_eq!(frame, Ok(None));
            None
        }
        Err(e) => {
            assert_eq!(e.errno, Errno::Proto, "{}", e.msg);
            None
        }
        Ok(Some((out, used))) => {
            let (f, n) = frame
                .expect("parse_reply accepted what MpaFrame::parse rejects")
                .unwrap();
            assert_eq!(n, used);
            assert_eq!(f.kind, MpaKind::Reply);
            // Stream semantics: the same with exactly the frame, "need more" one byte short.
            assert_eq!(parse_reply(&data[..used], ours).unwrap(), Some((out.clone(), used)));
            assert!(parse_reply(&data[..used - 1], ours).unwrap().is_none());
            match &out {
                ReplyOutcome::Rejected(pd) => {
                    assert!(f.reject);
                    assert_eq!(pd, &f.private_data);
                }
                ReplyOutcome::Accepted(n) => {
                    assert!(!f.reject && !f.markers);
                    assert!(n.ord >= 1 && n.ord <= ours.ord.max(1), "{n:?}");
                    assert_eq!(n.ird, clamp14(ours.ird));
                    assert_eq!(n.crc, f.crc || ours.crc);
                    assert_eq!(n.revision, f.revision);
                    assert_eq!(n.peer_private_data, f.private_data);
                    if let Some(e) = f.enhanced {
                        // Never more READs outstanding than the responder said it accepts.
                        assert!(n.ord <= u32::from(e.ird).max(1), "{n:?} vs {e:?}");
                    } else {
                        assert!(n.rtr.is_none(), "RTR without the RFC 6581 block");
                    }
                }
            }
            Some((out, used))
        }
    }
}

/// Responder accepts `req` with `p`; the initiator (whose parameters are read back from the
/// request) must accept the reply with a matching negotiation.
fn accept_and_check(req: &MpaFrame, p: &MpaParams, initiator: &MpaParams) -> Option<Negotiated> {
    let r = build_accept(req, p);
    if req.markers {
        let e = r.expect_err("markers must be refused");
        assert_eq!(e.errno, Errno::Proto);
        return None;
    }
    let (reply, neg) = match r {
        Ok(x) => x,
        Err(e) => panic!(
            "build_accept failed on a parsed request with valid parameters: {}",
            e.msg
        ),
    };
    let (f, n) = MpaFrame::parse(&reply).unwrap().unwrap();
    assert_eq!(n, reply.len());
    assert_eq!(f.kind, MpaKind::Reply);
    assert!(!f.reject && !f.markers);
    assert_eq!((f.crc, f.revision), (neg.crc, neg.revision));
    assert_eq!(f.private_data, p.private_data);
    assert!(neg.crc == (req.crc || p.crc));
    assert!(neg.ird >= 1 && neg.ird <= 0x3fff);
    assert!(neg.ord >= 1 && neg.ord <= p.ord.max(1));
    assert_eq!(neg.peer_private_data, req.private_data);
    if neg.rtr.is_some() {
        assert!(f.enhanced.is_some() && req.enhanced.is_some());
    }
    if let (Some(fe), Some(re)) = (f.enhanced, req.enhanced) {
        assert_eq!(u32::from(fe.ird), neg.ird);
        assert_eq!(u32::from(fe.ord), neg.ord);
        assert!(
            neg.ord <= u32::from(re.ird).max(1),
            "responder ORD above the initiator's IRD"
        );
    }
    assert!(parse_request(&reply).is_err(), "a reply parsed as a request");

    let (out, used) = check_reply(&reply, initiator).expect("our own reply must parse");
    assert_eq!(used, reply.len());
    let ReplyOutcome::Accepted(ni) = out else {
        panic!("accept parsed as reject")
    };
    assert_eq!(ni.crc, neg.crc, "the two sides disagree on CRC");
    assert_eq!(ni.rtr, neg.rtr, "the two sides disagree on the RTR");
    assert_eq!(ni.revision, neg.revision);
    assert_eq!(ni.peer_private_data, p.private_data);
    if f.enhanced.is_some() {
        assert!(
            ni.ord <= neg.ird,
            "initiator ORD {} above responder IRD {}",
            ni.ord,
            neg.ird
        );
    }
    Some(neg)
}

fn reject_and_check(req: &MpaFrame, pd: &[u8], initiator: &MpaParams) {
    let rej = build_reject(req.revision, pd).unwrap();
    let (out, used) = check_reply(&rej, initiator).expect("our own reject must parse");
    assert_eq!(used, rej.len());
    assert_eq!(out, ReplyOutcome::Rejected(pd.to_vec()));
}

fn initiator_of(req: &MpaFrame) -> MpaParams {
    MpaParams {
        private_data: req.private_data.clone(),
        ird: req.enhanced.map_or(1, |e| u32::from(e.ird)),
        ord: req.enhanced.map_or(1, |e| u32::from(e.ord)),
        crc: req.crc,
        p2p: req.enhanced.is_some_and(|e| e.peer_to_peer),
    }
}

fn raw_request(data: &[u8]) {
    match parse_request(data) {
        Ok(None) => assert_eq!(MpaFrame::parse(data), Ok(None)),
        Err(e) => assert_eq!(e.errno, Errno::Proto, "{}", e.msg),
        Ok(Some((req, used))) => {
            assert_eq!(req.kind, MpaKind::Request);
            assert!(used <= data.len());
            assert_eq!(parse_request(&data[..used]).unwrap(), Some((req.clone(), used)));
            assert!(parse_request(&data[..used - 1]).unwrap().is_none());
            let initiator = initiator_of(&req);
            for p in variants() {
                accept_and_check(&req, &p, &initiator);
            }
            reject_and_check(&req, b"", &initiator);
            reject_and_check(&req, &[0xee; MPA_MAX_PD_LEN], &initiator);
        }
    }
}

/// Encode-first: input-derived parameters through the whole exchange.
fn exchange(data: &[u8]) {
    if data.len() < 10 {
        return;
    }
    let pd_len = usize::from(u16::from_le_bytes([data[0], data[1]])) % (MPA_MAX_PD_LEN + 16);
    let ours = MpaParams {
        private_data: data.iter().copied().cycle().take(pd_len).collect(),
        ird: u32::from_le_bytes([data[2], data[3], data[4], data[5]]) >> (data[9] & 31),
        ord: u32::from_le_bytes([data[5], data[6], data[7], data[8]]) >> (data[9] >> 3 & 31),
        crc: data[9] & 1 != 0,
        p2p: data[9] & 2 != 0,
    };
    let req = match build_request(&ours) {
        Ok(r) => {
            assert!(pd_len <= MPA_MAX_PD_LEN);
            r
        }
        Err(e) => {
            assert!(
                pd_len > MPA_MAX_PD_LEN,
                "build_request refused {pd_len} bytes: {}",
                e.msg
            );
            assert_eq!(e.errno, Errno::Inval);
            return;
        }
    };
    let (frame, used) = parse_request(&req).unwrap().unwrap();
    assert_eq!(used, req.len());
    assert_eq!(frame.private_data, ours.private_data);
    assert_eq!(frame.crc, ours.crc);
    assert!(!frame.markers && !frame.reject);
    assert_eq!(frame.revision, if pd_len + 4 <= MPA_MAX_PD_LEN { 2 } else { 1 });
    if let Some(e) = frame.enhanced {
        assert_eq!(u32::from(e.ird), clamp14(ours.ird));
        assert_eq!(u32::from(e.ord), clamp14(ours.ord));
        // Peer-to-peer (both RTR types offered) only when asked for (handshake.rs rules).
        assert_eq!(e.peer_to_peer, ours.p2p);
        assert_eq!((e.read_rtr, e.write_rtr), (ours.p2p, ours.p2p));
    }
    assert!(parse_reply(&req, &ours).is_err(), "a request parsed as a reply");
    for p in variants() {
        let neg = accept_and_check(&frame, &p, &ours).expect("softrdma never asks for markers");
        // Two softrdma peers that both fit the RFC 6581 block agree on an RTR exactly when
        // the initiator asked for peer-to-peer mode.
        let both_enhanced = frame.enhanced.is_some() && p.private_data.len() + 4 <= MPA_MAX_PD_LEN;
        assert_eq!(neg.rtr.is_some(), both_enhanced && ours.p2p);
    }
    reject_and_check(&frame, &ours.private_data, &ours);
}

fuzz_target!(|data: &[u8]| {
    raw_request(data);
    for ours in variants() {
        check_reply(data, &ours);
    }
    exchange(data);
});
