//! Which lender holds a block: rendezvous (highest-random-weight) hashing.
//!
//! Every (server, key) pair gets a pseudo-random score; a key lives on the server with the
//! highest score. No table is kept, the borrower computes the answer on every lookup, and a
//! change in the server set moves only the keys whose best server changed: adding an n-th
//! server moves about 1/n of the keys (all to the new server); losing one moves only its own
//! keys. That is the property the borrower's index relies on (issue 3: "adding or losing a
//! server moves only its share").

/// A finaliser with full avalanche (MurmurHash3's fmix64): every input bit flips each output
/// bit with probability about 1/2, so scores of one key on different servers are independent.
#[inline]
pub fn mix64(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^= x >> 33;
    x
}

/// The score of `key_hash` on the server identified by `server_seed`.
#[inline]
pub fn score(server_seed: u64, key_hash: u64) -> u64 {
    mix64(key_hash ^ mix64(server_seed))
}

/// The index (into `servers`) of the server that holds `key_hash`, or `None` when there are
/// no servers. `servers` are the servers' seeds (stable identities, e.g. a hash of the
/// configured address), not their positions, so reordering the list moves nothing.
pub fn rendezvous(key_hash: u64, servers: &[u64]) -> Option<usize> {
    servers.iter().enumerate().max_by_key(|&(_, &seed)| (score(seed, key_hash), seed)).map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owners(servers: &[u64], keys: u64) -> Vec<u64> {
        (0..keys).map(|k| servers[rendezvous(mix64(k), servers).unwrap()]).collect()
    }

    #[test]
    fn no_servers_no_owner() {
        assert_eq!(rendezvous(1, &[]), None);
        assert_eq!(rendezvous(1, &[42]), Some(0));
    }

    #[test]
    fn keys_spread_evenly() {
        let servers = [11, 22, 33, 44];
        let o = owners(&servers, 100_000);
        for s in servers {
            let n = o.iter().filter(|&&x| x == s).count();
            assert!((22_500..=27_500).contains(&n), "server {s} owns {n} of 100000");
        }
    }

    #[test]
    fn order_of_the_list_does_not_matter() {
        let a = owners(&[1, 2, 3], 10_000);
        let b = owners(&[3, 1, 2], 10_000);
        assert_eq!(a, b);
    }

    #[test]
    fn adding_a_server_moves_only_its_share() {
        let before = owners(&[1, 2, 3], 60_000);
        let after = owners(&[1, 2, 3, 4], 60_000);
        let moved: Vec<_> = before.iter().zip(&after).filter(|(b, a)| b != a).collect();
        assert!(moved.iter().all(|(_, a)| **a == 4), "keys moved between old servers");
        let share = moved.len() as f64 / 60_000.0;
        assert!((0.22..=0.28).contains(&share), "moved {share}");
    }

    #[test]
    fn losing_a_server_moves_only_its_keys() {
        let before = owners(&[1, 2, 3, 4], 60_000);
        let after = owners(&[1, 2, 4], 60_000);
        for (b, a) in before.iter().zip(&after) {
            if *b != 3 {
                assert_eq!(a, b, "a key of a surviving server moved");
            }
        }
    }
}
