//! QP numbers that say which process owns them.
//!
//! A soft-RoCE QPN is `index << 16 | port`: `port` is the UDP port of a socket the owning
//! process holds (its *home port*), `index` (1..=255) picks one of the QPs behind it. Any
//! process that receives a packet for a QPN it does not own can therefore hand it to the
//! owner without a lookup table (see the `forward` module). QPN 0, 1 and 0xFFFFFF (multicast)
//! are never produced.

/// QPs behind one home port.
pub const QPS_PER_PORT: usize = 255;

/// The multicast destination QPN.
pub const MULTICAST_QPN: u32 = 0xFF_FFFF;

/// The GSI QP (CM MADs).
pub const GSI_QPN: u32 = 1;

/// Builds a QPN from a home port and an index in 1..=255; None if the pair is not usable.
pub fn make_qpn(port: u16, index: u8) -> Option<u32> {
    let qpn = (u32::from(index) << 16) | u32::from(port);
    (index != 0 && port != 0 && qpn != MULTICAST_QPN).then_some(qpn)
}

/// The home port and index of a QPN (None for QP0/QP1/multicast and other reserved values).
pub fn split_qpn(qpn: u32) -> Option<(u16, u8)> {
    let port = (qpn & 0xffff) as u16;
    let index = ((qpn >> 16) & 0xff) as u8;
    (qpn <= 0xFF_FFFF && index != 0 && port != 0 && qpn != MULTICAST_QPN).then_some((port, index))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_reserved() {
        assert_eq!(make_qpn(4791, 1), Some(0x01_12b7));
        assert_eq!(split_qpn(0x01_12b7), Some((4791, 1)));
        assert_eq!(make_qpn(0, 3), None);
        assert_eq!(make_qpn(5000, 0), None);
        assert_eq!(make_qpn(0xffff, 0xff), None);
        assert_eq!(split_qpn(GSI_QPN), None);
        assert_eq!(split_qpn(0), None);
        assert_eq!(split_qpn(MULTICAST_QPN), None);
        for port in [1u16, 40000, 65535] {
            for idx in [1u8, 17, 254] {
                let q = make_qpn(port, idx).unwrap();
                assert!(q > 1 && q < MULTICAST_QPN);
                assert_eq!(split_qpn(q), Some((port, idx)));
            }
        }
    }
}
