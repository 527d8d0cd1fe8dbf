//! Constant strings: `ibv_wc_status_str`, `ibv_event_type_str`, `ibv_node_type_str`,
//! `ibv_port_state_str` and `rdma_event_str`, with rdma-core 44's texts (`tests/dropin.rs`
//! compares them with Debian's libibverbs).

use std::ffi::{c_char, c_int, CStr};

/// `enum ibv_wc_status` texts, indexed by value (`libibverbs/enum_strs.c`).
const WC_STATUS: [&CStr; 24] = [
    c"success",
    c"local length error",
    c"local QP operation error",
    c"local EE context operation error",
    c"local protection error",
    c"Work Request Flushed Error",
    c"memory management operation error",
    c"bad response error",
    c"local access error",
    c"remote invalid request error",
    c"remote access error",
    c"remote operation error",
    c"transport retry counter exceeded",
    c"RNR retry counter exceeded",
    c"local RDD violation error",
    c"remote invalid RD request",
    c"aborted error",
    c"invalid EE context number",
    c"invalid EE context state",
    c"fatal error",
    c"response timeout error",
    c"general error",
    c"TM error",
    c"TM software rendezvous",
];

/// `enum ibv_event_type` texts, indexed by value.
const EVENT_TYPE: [&CStr; 20] = [
    c"CQ error",
    c"local work queue catastrophic error",
    c"invalid request local work queue error",
    c"local access violation work queue error",
    c"communication established",
    c"send queue drained",
    c"path migrated",
    c"path migration request error",
    c"local catastrophic error",
    c"port active",
    c"port error",
    c"LID change",
    c"P_Key change",
    c"SM change",
    c"SRQ catastrophic error",
    c"SRQ limit reached",
    c"last WQE reached",
    c"client reregistration",
    c"GID table change",
    c"WQ fatal",
];

/// `enum ibv_node_type` texts, indexed by value (0, `IBV_NODE_UNKNOWN`, has none).
const NODE_TYPE: [&CStr; 8] = [
    c"unknown",
    c"InfiniBand channel adapter",
    c"InfiniBand switch",
    c"InfiniBand router",
    c"iWARP NIC",
    c"usNIC",
    c"usNIC UDP",
    c"unspecified",
];

/// `enum ibv_port_state` texts, indexed by value.
const PORT_STATE: [&CStr; 6] = [
    c"no state change (NOP)",
    c"down",
    c"init",
    c"armed",
    c"active",
    c"active defer",
];

/// `enum rdma_cm_event_type` names, indexed by value (`librdmacm/cma.c`).
const CM_EVENT: [&CStr; 16] = [
    c"RDMA_CM_EVENT_ADDR_RESOLVED",
    c"RDMA_CM_EVENT_ADDR_ERROR",
    c"RDMA_CM_EVENT_ROUTE_RESOLVED",
    c"RDMA_CM_EVENT_ROUTE_ERROR",
    c"RDMA_CM_EVENT_CONNECT_REQUEST",
    c"RDMA_CM_EVENT_CONNECT_RESPONSE",
    c"RDMA_CM_EVENT_CONNECT_ERROR",
    c"RDMA_CM_EVENT_UNREACHABLE",
    c"RDMA_CM_EVENT_REJECTED",
    c"RDMA_CM_EVENT_ESTABLISHED",
    c"RDMA_CM_EVENT_DISCONNECTED",
    c"RDMA_CM_EVENT_DEVICE_REMOVAL",
    c"RDMA_CM_EVENT_MULTICAST_JOIN",
    c"RDMA_CM_EVENT_MULTICAST_ERROR",
    c"RDMA_CM_EVENT_ADDR_CHANGE",
    c"RDMA_CM_EVENT_TIMEWAIT_EXIT",
];

fn lookup(table: &[&'static CStr], value: c_int, unknown: &'static CStr) -> *const c_char {
    usize::try_from(value)
        .ok()
        .and_then(|i| table.get(i))
        .copied()
        .unwrap_or(unknown)
        .as_ptr()
}

c_fn! {
    /// `const char *ibv_wc_status_str(enum ibv_wc_status status)`; "unknown" out of range.
    fn ibv_wc_status_str(status: c_int) -> *const c_char {
        lookup(&WC_STATUS, status, c"unknown")
    }

    /// `const char *ibv_event_type_str(enum ibv_event_type event)`; "unknown" out of range.
    fn ibv_event_type_str(event: c_int) -> *const c_char {
        lookup(&EVENT_TYPE, event, c"unknown")
    }

    /// `const char *ibv_node_type_str(enum ibv_node_type node_type)`; "unknown" out of range.
    fn ibv_node_type_str(node_type: c_int) -> *const c_char {
        lookup(&NODE_TYPE, node_type, c"unknown")
    }

    /// `const char *ibv_port_state_str(enum ibv_port_state port_state)`; "unknown" out of
    /// range.
    fn ibv_port_state_str(port_state: c_int) -> *const c_char {
        lookup(&PORT_STATE, port_state, c"unknown")
    }

    /// `const char *rdma_event_str(enum rdma_cm_event_type event)`; "UNKNOWN EVENT" out of
    /// range.
    fn rdma_event_str(event: c_int) -> *const c_char {
        lookup(&CM_EVENT, event, c"UNKNOWN EVENT")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(p: *const c_char) -> &'static str {
        // SAFETY: every pointer returned here is a 'static C string literal.
        unsafe { CStr::from_ptr(p) }.to_str().unwrap()
    }

    #[test]
    fn strings_match_rdma_core() {
        // SAFETY: no pointer arguments.
        unsafe {
            assert_eq!(s(ibv_wc_status_str(0)), "success");
            assert_eq!(s(ibv_wc_status_str(5)), "Work Request Flushed Error");
            assert_eq!(s(ibv_wc_status_str(23)), "TM software rendezvous");
            assert_eq!(s(ibv_wc_status_str(24)), "unknown");
            assert_eq!(s(ibv_wc_status_str(-1)), "unknown");
            assert_eq!(s(rdma_event_str(9)), "RDMA_CM_EVENT_ESTABLISHED");
            assert_eq!(s(rdma_event_str(15)), "RDMA_CM_EVENT_TIMEWAIT_EXIT");
            assert_eq!(s(rdma_event_str(16)), "UNKNOWN EVENT");
        }
    }
}
