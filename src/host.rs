//! The seam between sluice and the proxy: what the request's logic needs from Envoy (`Host`)
//! and what the configuration reads from it once (`Environment`). `wasm` implements both over
//! proxy-wasm's hostcalls; `testing` fakes them, so the filter runs natively in tests.

use crate::config::GlobalService;
use crate::core::request::RequestSource;
use crate::output::reply::LocalReply;
use crate::state::store::Store;
use crate::wire::protocol::Settlement;

/// What the filter needs from the proxy.
pub trait Host: RequestSource + Store {
    /// Wall-clock time, Unix nanoseconds.
    fn now(&self) -> u64;
    /// Sends a local reply instead of forwarding the request.
    fn send_response(&self, reply: &LocalReply);
    /// Puts the request's record where the access log reads it (`access_log::PROPERTY`).
    fn record(&self, record: &str);
    /// Starts a call to the rate-limit service, as its protocol says (an HTTP POST of the body,
    /// or a gRPC `ShouldRateLimit` carrying it); false if it could not be started. The answer
    /// comes back through `Filter::on_service_response`.
    fn dispatch(&self, service: &GlobalService, body: &[u8]) -> bool;
    /// Hands what a request owes a global policy after its admission to the worker's outbox
    /// (`outbox`), which sends it to the service later, off every request's path.
    fn report(&self, service: &GlobalService, settlement: Settlement);
    /// The response's headers as they pass through (`response`), all in one read: a metered
    /// policy needs several, and each read is a crossing into the host.
    fn response_headers(&self) -> Vec<(String, Vec<u8>)>;
    /// A trailer of the response.
    fn response_trailer(&self, name: &str) -> Option<Vec<u8>>;
    /// Sets filter state other filters and the access log read (`wasm.<name>`).
    fn publish(&self, name: &str, value: &str);
}

/// What the filter reads from the proxy once, when it is configured.
pub trait Environment {
    /// A variable of the VM's environment (Envoy: `vm_config.environment_variables`).
    fn var(&self, name: &str) -> Option<String>;
    /// Random bytes from the host: for a hash secret of this Envoy's own.
    fn random(&self) -> Option<[u8; 16]>;
}

/// The header pairs of a map as the proxy-wasm ABI serializes it: the number of pairs, each
/// pair's name and value sizes, then the names and values, each followed by a NUL (sizes
/// little-endian `u32`). A pair past what `bytes` hold ends the list; a name that is not UTF-8
/// is left out (Envoy never gives one).
pub fn header_pairs(bytes: &[u8]) -> Vec<(String, Vec<u8>)> {
    let word = |at: usize| -> Option<usize> {
        let word = bytes.get(at..at.checked_add(4)?)?;
        usize::try_from(u32::from_le_bytes(word.try_into().ok()?)).ok()
    };
    let Some(count) = word(0) else {
        return Vec::new();
    };
    let mut pairs = Vec::with_capacity(count.min(64));
    let mut at = count.saturating_mul(8).saturating_add(4);
    let mut take = |size: usize| -> Option<&[u8]> {
        let taken = bytes.get(at..at.checked_add(size)?)?;
        at = at.checked_add(size)?.checked_add(1)?;
        Some(taken)
    };
    for n in 0..count {
        let sizes = (word(4 + n * 8), word(8 + n * 8));
        let (Some(name_size), Some(value_size)) = sizes else {
            break;
        };
        let (Some(name), Some(value)) = (take(name_size), take(value_size)) else {
            break;
        };
        if let Ok(name) = std::str::from_utf8(name) {
            pairs.push((name.to_string(), value.to_vec()));
        }
    }
    pairs
}

#[cfg(test)]
mod tests {
    use super::header_pairs;

    fn serialize(pairs: &[(&str, &[u8])]) -> Vec<u8> {
        let mut out = (pairs.len() as u32).to_le_bytes().to_vec();
        for (name, value) in pairs {
            out.extend((name.len() as u32).to_le_bytes());
            out.extend((value.len() as u32).to_le_bytes());
        }
        for (name, value) in pairs {
            out.extend(name.as_bytes());
            out.push(0);
            out.extend(*value);
            out.push(0);
        }
        out
    }

    #[test]
    fn header_pairs_read_what_the_abi_serializes_and_stop_at_a_cut() {
        let pairs: &[(&str, &[u8])] = &[(":status", b"200"), ("content-type", b"a/b"), ("x", b"")];
        let bytes = serialize(pairs);
        let read = header_pairs(&bytes);
        let read: Vec<(&str, &[u8])> = read
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_slice()))
            .collect();
        assert_eq!(read, pairs);
        for cut in 0..bytes.len() - 1 {
            assert!(
                header_pairs(&bytes[..cut]).len() < pairs.len(),
                "cut at {cut}"
            );
        }
        assert!(header_pairs(&[]).is_empty());
        let mut huge = serialize(pairs);
        huge[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(header_pairs(&huge).is_empty());
    }
}
