//! Unit and property tests of the cluster-pool index, specs and rebuild.

use std::collections::BTreeSet;

use ipnet::IpNet;
use proptest::prelude::*;

use super::spec::{overlaps, parse_cidr};
use super::*;
use crate::types::{Family, PerFamily};

fn net(s: &str) -> IpNet {
    s.parse().unwrap()
}

fn pool(name: &str, cidrs: &[&str]) -> PoolSpec {
    PoolSpec::new(name, cidrs.iter().map(|c| net(c)).collect())
}

// ---------------------------------------------------------------- unit tests

#[test]
fn counts_of_a_v4_24_in_28_blocks() {
    let p = PoolIndex::new(&pool("p", &["10.0.0.0/24"])).unwrap();
    let i = p.family(Family::V4).unwrap();
    assert_eq!(i.capacity(), 16);
    assert_eq!(i.free(), 16);
    assert_eq!(i.allocated(), 0);
    assert_eq!(i.block_addresses(), 16);
    // 256 addresses minus network and broadcast
    assert_eq!(
        i.addresses(),
        AddressCounts {
            capacity: 254,
            allocated: 0,
            free: 254
        }
    );
    assert!(p.family(Family::V6).is_none());
}

#[test]
fn ipv4_network_and_broadcast_are_never_usable() {
    let p = PoolIndex::new(&pool("p", &["10.0.0.0/24"])).unwrap();
    let i = p.family(Family::V4).unwrap();
    let first = net("10.0.0.0/28");
    let last = net("10.0.0.240/28");
    let usable = i.usable_addresses(&first).unwrap();
    assert_eq!(usable.len(Family::V4), 15);
    assert!(!usable.contains(&"10.0.0.0".parse().unwrap()));
    assert_eq!(i.usable_count(&first), Ok(15));
    let usable = i.usable_addresses(&last).unwrap();
    assert!(!usable.contains(&"10.0.0.255".parse().unwrap()));
    assert_eq!(usable.len(Family::V4), 15);
    assert_eq!(i.usable_count(&net("10.0.0.16/28")), Ok(16));

    // per-address grants: the two /32 blocks are never handed out at all
    let spec = pool("p", &["10.0.0.0/24"]).with_block_size(PerFamily { v4: 32, v6: 128 });
    let mut p = PoolIndex::new(&spec).unwrap();
    assert_eq!(p.family(Family::V4).unwrap().capacity(), 254);
    let mut got = BTreeSet::new();
    while let Ok(b) = p.claim(Family::V4, 0) {
        got.insert(b);
    }
    assert_eq!(got.len(), 254);
    assert!(!got.contains(&net("10.0.0.0/32")));
    assert!(!got.contains(&net("10.0.0.255/32")));
    assert!(matches!(
        p.claim_block(&net("10.0.0.0/32")),
        Err(PoolError::BlockExcluded { .. })
    ));

    // /31 and /32 CIDRs are point-to-point: every address usable
    let spec = pool("p", &["10.0.0.0/31"]).with_block_size(PerFamily { v4: 31, v6: 124 });
    let p = PoolIndex::new(&spec).unwrap();
    let i = p.family(Family::V4).unwrap();
    assert_eq!(i.usable_count(&net("10.0.0.0/31")), Ok(2));
    assert_eq!(i.addresses().capacity, 2);
}

#[test]
fn ipv6_reserves_nothing() {
    let p = PoolIndex::new(&pool("p", &["fd00::/120"])).unwrap();
    let i = p.family(Family::V6).unwrap();
    assert_eq!(i.capacity(), 16);
    assert_eq!(i.addresses().capacity, 256);
    assert_eq!(i.usable_count(&net("fd00::/124")), Ok(16));
}

#[test]
fn claim_walks_cidrs_in_order_from_the_start_and_wraps() {
    // two /27s = 2 blocks each; spec order is the walk order, not address order
    let mut p = PoolIndex::new(&pool("p", &["10.0.1.0/27", "10.0.0.0/27"])).unwrap();
    // offset 1 = second block of the first CIDR
    assert_eq!(p.claim(Family::V4, 1), Ok(net("10.0.1.16/28")));
    assert_eq!(p.claim(Family::V4, 1), Ok(net("10.0.0.0/28")));
    assert_eq!(p.claim(Family::V4, 1), Ok(net("10.0.0.16/28")));
    // wraps around to the first CIDR's block 0
    assert_eq!(p.claim(Family::V4, 1), Ok(net("10.0.1.0/28")));
    // the start is taken modulo the number of blocks
    p.release(&net("10.0.0.16/28")).unwrap();
    assert_eq!(p.claim(Family::V4, 4 * 1000 + 3), Ok(net("10.0.0.16/28")));
    assert_eq!(
        p.claim(Family::V4, 0),
        Err(PoolError::Exhausted {
            pool: "p".into(),
            family: Family::V4
        })
    );
    assert_eq!(
        p.claim(Family::V4, u128::MAX).unwrap_err().class(),
        crate::error::ErrorClass::Exhausted
    );
}

#[test]
fn claim_of_a_specific_block_checks_everything() {
    let spec = pool("p", &["10.0.0.0/24", "fd00::/120"]).with_exclude(vec![net("10.0.0.32/30")]);
    let mut p = PoolIndex::new(&spec).unwrap();
    let b = net("10.0.0.16/28");
    assert_eq!(p.claim_block(&b), Ok(()));
    assert!(p.is_taken(&b));
    assert_eq!(
        p.claim_block(&b),
        Err(PoolError::BlockTaken {
            pool: "p".into(),
            block: b
        })
    );
    assert!(matches!(
        p.claim_block(&net("10.0.1.0/28")),
        Err(PoolError::BlockOutsidePool { .. })
    ));
    assert!(matches!(
        p.claim_block(&net("10.0.0.0/27")),
        Err(PoolError::WrongBlockSize { expected: 28, .. })
    ));
    assert!(matches!(
        p.claim_block(&net("10.0.0.17/28")),
        Err(PoolError::Misaligned { .. })
    ));
    assert!(matches!(
        p.claim_block(&net("10.0.0.32/28")),
        Err(PoolError::BlockExcluded { .. })
    ));
    assert_eq!(p.claim_block(&net("fd00::10/124")), Ok(()));
    let v4only = PoolIndex::new(&pool("q", &["10.0.0.0/24"])).unwrap();
    let mut v4only = v4only;
    assert_eq!(
        v4only.claim(Family::V6, 0),
        Err(PoolError::FamilyNotServed {
            pool: "q".into(),
            family: Family::V6
        })
    );
    assert!(!v4only.is_taken(&net("fd00::/124")));
}

#[test]
fn release_is_idempotent_and_checked() {
    let mut p = PoolIndex::new(&pool("p", &["10.0.0.0/24"])).unwrap();
    let b = p.claim(Family::V4, 5).unwrap();
    assert_eq!(p.release(&b), Ok(true));
    assert_eq!(p.release(&b), Ok(false));
    assert!(matches!(
        p.release(&net("192.168.0.0/28")),
        Err(PoolError::BlockOutsidePool { .. })
    ));
    assert_eq!(p.family(Family::V4).unwrap().allocated(), 0);
}

#[test]
fn exclusions_are_block_granular() {
    let spec = pool("p", &["10.0.0.0/24"]).with_exclude(vec![
        net("10.0.0.5/32"),
        net("10.0.0.64/26"),
        net("10.0.0.66/31"),
    ]);
    let mut p = PoolIndex::new(&spec).unwrap();
    // 16 blocks − block 0 (holds .5) − blocks 4..=7 (the /26)
    assert_eq!(p.family(Family::V4).unwrap().capacity(), 11);
    let mut got = Vec::new();
    while let Ok(b) = p.claim(Family::V4, 0) {
        got.push(b);
    }
    assert_eq!(got.len(), 11);
    for b in &got {
        for e in &spec.exclude {
            assert!(!overlaps(b, e), "{b} overlaps exclusion {e}");
        }
    }
    // network address's block is excluded here, so capacity in addresses loses only .255
    assert_eq!(
        p.family(Family::V4).unwrap().addresses().capacity,
        11 * 16 - 1
    );
}

#[test]
fn bad_specs_give_typed_errors_naming_pool_and_value() {
    let d = DEFAULT_BLOCK_SIZE;
    let e = PoolSpec::parse("a", &["10.0.0.0/33"], d, &[]).unwrap_err();
    assert!(
        matches!(&e, PoolError::InvalidCidr { pool, field: Field::Cidrs, value, .. } if pool == "a" && value == "10.0.0.0/33")
    );
    assert!(e.to_string().contains("10.0.0.0/33"));
    let e = PoolSpec::parse("a", &["banana"], d, &[]).unwrap_err();
    assert!(matches!(&e, PoolError::InvalidCidr { value, .. } if value == "banana"));
    let e = PoolSpec::parse("a", &["10.0.0.1/24"], d, &[]).unwrap_err();
    assert!(e.to_string().contains("did you mean 10.0.0.0/24"), "{e}");
    let e = PoolSpec::parse("a", &["10.0.0.0/24"], d, &["x"]).unwrap_err();
    assert!(matches!(
        &e,
        PoolError::InvalidCidr {
            field: Field::Exclude,
            ..
        }
    ));
    let e = PoolSpec::parse("a", &["10.0.0.0/24"], PerFamily { v4: 33, v6: 124 }, &[]).unwrap_err();
    assert_eq!(
        e,
        PoolError::InvalidBlockSize {
            pool: "a".into(),
            family: Family::V4,
            prefix: 33
        }
    );
    let e = PoolSpec::parse("a", &["fd00::/64"], PerFamily { v4: 28, v6: 129 }, &[]).unwrap_err();
    assert!(matches!(
        e,
        PoolError::InvalidBlockSize {
            family: Family::V6,
            prefix: 129,
            ..
        }
    ));
    let e = PoolSpec::parse("a", &["10.0.0.0/24"], PerFamily { v4: 20, v6: 124 }, &[]).unwrap_err();
    assert!(
        matches!(&e, PoolError::BlockSizeDoesNotFit { pool, prefix: 20, cidr, .. } if pool == "a" && *cidr == net("10.0.0.0/24"))
    );
    let e = PoolSpec::parse("a", &["fd00::/48"], PerFamily { v4: 28, v6: 128 }, &[]).unwrap_err();
    assert!(matches!(
        e,
        PoolError::BlockSizeDoesNotFit { prefix: 128, .. }
    ));
    let e = PoolSpec::parse("a", &["10.0.0.0/24"], d, &["10.0.1.0/28"]).unwrap_err();
    assert_eq!(
        e,
        PoolError::ExclusionOutsidePool {
            pool: "a".into(),
            exclusion: net("10.0.1.0/28")
        }
    );
    // partially outside is outside
    let e = PoolSpec::parse("a", &["10.0.0.0/24"], d, &["10.0.0.0/23"]).unwrap_err();
    assert!(matches!(e, PoolError::ExclusionOutsidePool { .. }));
    let e = PoolSpec::parse::<&str>("a", &[], d, &[]).unwrap_err();
    assert!(matches!(
        e,
        PoolError::EmptyPool {
            reason: "no CIDRs",
            ..
        }
    ));
    let e = PoolSpec::parse("a", &["10.0.0.0/24"], d, &["10.0.0.0/24"]).unwrap_err();
    assert!(matches!(
        e,
        PoolError::EmptyPool {
            reason: "every block is excluded",
            ..
        }
    ));
    let e = PoolSpec::parse("a", &["10.0.0.0/24", "10.0.0.128/25"], d, &[]).unwrap_err();
    assert_eq!(
        e,
        PoolError::OverlappingCidrs {
            pool: "a".into(),
            first: net("10.0.0.0/24"),
            second: net("10.0.0.128/25")
        }
    );
    let e = PoolSpec::parse("a", &["10.0.0.0/24", "10.0.0.0/24"], d, &[]).unwrap_err();
    assert!(matches!(e, PoolError::OverlappingCidrs { .. }));
    // a /31 CIDR in /32 blocks keeps both addresses
    assert!(PoolSpec::parse("a", &["10.0.0.0/31"], PerFamily { v4: 32, v6: 128 }, &[]).is_ok());
    // a /30 in /32 blocks has two usable addresses
    let s = PoolSpec::parse("a", &["10.0.0.0/30"], PerFamily { v4: 32, v6: 128 }, &[]).unwrap();
    assert_eq!(
        PoolIndex::new(&s)
            .unwrap()
            .family(Family::V4)
            .unwrap()
            .capacity(),
        2
    );
    // every error is permanent except exhaustion and a taken block
    assert_eq!(e.class(), crate::error::ErrorClass::Permanent);
    assert_eq!(e.pool(), "a");
}

#[test]
fn later_overlapping_pool_is_invalid_others_keep_working() {
    let specs = vec![
        pool("a", &["10.0.0.0/16"]),
        pool("b", &["10.0.128.0/24", "fd00::/64"]),
        pool("c", &["10.1.0.0/16"]),
        pool("d", &["banana-is-not-here/1"; 0]), // empty: invalid on its own
        pool("e", &["fd00::/60"]),               // overlaps b, but b is invalid: e is valid
        pool("a", &["10.9.0.0/16"]),             // duplicate name
    ];
    let v = check_pools(&specs);
    assert_eq!(v[0], Ok(()));
    assert_eq!(
        v[1],
        Err(PoolError::OverlapsPool {
            pool: "b".into(),
            cidr: net("10.0.128.0/24"),
            other_pool: "a".into(),
            other_cidr: net("10.0.0.0/16")
        })
    );
    assert_eq!(v[2], Ok(()));
    assert!(matches!(v[3], Err(PoolError::EmptyPool { .. })));
    assert_eq!(v[4], Ok(()));
    assert_eq!(v[5], Err(PoolError::DuplicateName { pool: "a".into() }));

    let mut set = PoolSet::new(specs);
    assert_eq!(set.validity().filter(|(_, r)| r.is_ok()).count(), 3);
    assert!(set.get_mut("a").unwrap().claim(Family::V4, 0).is_ok());
    assert!(matches!(set.get("b"), Err(PoolError::OverlapsPool { .. })));
    assert!(matches!(set.get("zz"), Err(PoolError::UnknownPool { .. })));
    assert_eq!(
        set.locate("10.1.2.3".parse().unwrap()),
        Some(("c", net("10.1.2.0/28")))
    );
    assert_eq!(set.locate("10.2.0.1".parse().unwrap()), None);
}

#[test]
fn ipv6_64_memory_is_proportional_to_claims() {
    let mut p = PoolIndex::new(&pool("p", &["fd00::/64"])).unwrap();
    let i = p.family_mut(Family::V6).unwrap();
    assert_eq!(i.capacity(), 1 << 60);
    assert_eq!(i.dense(), vec![false]);
    assert_eq!(i.stored_entries(), 0);
    let empty = i.heap_bytes();
    let mut x: u128 = 0x9e37_79b9_7f4a_7c15;
    let mut got = BTreeSet::new();
    for _ in 0..5_000 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        got.insert(i.claim(x >> 64).unwrap());
    }
    assert_eq!(got.len(), 5_000);
    assert!(i.stored_entries() <= 5_000);
    let per_claim = (i.heap_bytes() - empty) / 5_000;
    assert!(per_claim <= 64, "{per_claim} bytes per claim");
    // releasing gives the memory back
    for b in &got {
        assert_eq!(i.release(b), Ok(true));
    }
    assert_eq!(i.stored_entries(), 0);
    assert!(
        i.heap_bytes() - empty <= 64 * 17 * 2,
        "{}",
        i.heap_bytes() - empty
    );
    // sequential claims collapse: a partial word at each end and one run of full words
    let mut q = PoolIndex::new(&pool("q", &["fd00::/64"])).unwrap();
    for _ in 0..5_000 {
        q.claim(Family::V6, 7).unwrap();
    }
    assert_eq!(q.family(Family::V6).unwrap().stored_entries(), 3);
    assert_eq!(q.family(Family::V6).unwrap().allocated(), 5_000);
}

#[test]
fn ipv4_12_in_28_blocks_is_an_8_kib_bitmap() {
    let p = PoolIndex::new(&pool("p", &["10.0.0.0/12"])).unwrap();
    let i = p.family(Family::V4).unwrap();
    assert_eq!(i.capacity(), 65_536);
    assert_eq!(i.dense(), vec![true]);
    // 1,024 words + 16 summary words
    assert_eq!(i.stored_entries(), 1_024 + 16);
}

#[test]
fn rebuild_reports_each_odd_record() {
    let specs = vec![
        pool("a", &["10.0.0.0/24"]).with_exclude(vec![net("10.0.0.64/28")]),
        pool("b", &["10.1.0.0/24"]),
        pool("c", &["fd00::/120"]),
    ];
    let mut set = PoolSet::new(specs);
    let recs: Vec<(&str, &str, &str)> = vec![
        ("a", "v4-10-0-0-16-28", "10.0.0.16/28"),  // 0 ok
        ("a", "v4-10-0-0-16-28", "10.0.0.16/28"),  // 1 duplicate of 0
        ("zz", "v4-10-0-0-32-28", "10.0.0.32/28"), // 2 unknown pool (still occupies)
        ("a", "v4-10-0-2-0-28", "10.0.2.0/28"),    // 3 out of range
        ("a", "v4-10-0-0-64-28", "10.0.0.64/28"),  // 4 excluded
        ("a", "whatever", "10.0.0.80/28"),         // 5 name mismatch, indexed
        ("a", "v4-10-0-0-96-28", "10.0.0.97/28"),  // 6 misaligned (occupies .96/28)
        (
            "c",
            "v6-fd00-0000-0000-0000-0000-0000-0000-0000-124",
            "fd00::/124",
        ), // 7 ok
        (
            "a",
            "v6-fd00-0000-0000-0000-0000-0000-0000-0000-124",
            "fd00::/124",
        ), // 8 a serves no v6; overlaps 7
        ("b", "v4-10-1-0-0-27", "10.1.0.0/27"),    // 9 wrong size: stray, b goes on
    ];
    let owned: Vec<BlockRecord<usize>> = recs
        .iter()
        .enumerate()
        .map(|(k, (p, n, c))| BlockRecord {
            key: k,
            name: n,
            pool: p,
            cidr: net(c),
        })
        .collect();
    let report = set.rebuild(owned);
    let kinds: Vec<(usize, &str)> = report
        .findings
        .iter()
        .map(|f| (f.key, f.kind.as_str()))
        .collect();
    assert_eq!(
        kinds,
        vec![
            (1, "duplicate"),
            (2, "unknown-pool"),
            (3, "out-of-range"),
            (4, "excluded"),
            (5, "name-mismatch"),
            (6, "misaligned"),
            (8, "out-of-range"),
            (8, "duplicate"),
            (9, "wrong-block-size"),
        ]
    );
    assert_eq!(
        report.findings[0].kind,
        FindingKind::Overlap { other: Some(0) }
    );
    assert_eq!(report.indexed, 3);
    // a stray block is reported and left out: its pool stays valid, its range taken
    let b = set
        .get("b")
        .expect("b stays valid")
        .family(Family::V4)
        .unwrap();
    let taken: Vec<IpNet> = b.iter_taken().collect();
    assert_eq!(taken, vec![net("10.1.0.0/28"), net("10.1.0.16/28")]);
    let a = set.get("a").unwrap().family(Family::V4).unwrap();
    // .16 (ok), .32 (unknown pool occupies), .80 (name mismatch), .96 (misaligned occupies)
    let taken: Vec<IpNet> = a.iter_taken().collect();
    assert_eq!(
        taken,
        vec![
            net("10.0.0.16/28"),
            net("10.0.0.32/28"),
            net("10.0.0.80/28"),
            net("10.0.0.96/28")
        ]
    );
    assert_eq!(a.free() + a.allocated(), a.capacity());
    // an odd-sized record covering a whole IPv6 /64 occupies 2^60 blocks in one run
    let mut set = PoolSet::new(vec![pool("v6", &["fd00::/64"])]);
    let name = block_name(&net("fd00::/64"));
    let r = set.rebuild([BlockRecord {
        key: (),
        name: &name,
        pool: "other",
        cidr: net("fd00::/64"),
    }]);
    assert_eq!(r.findings.len(), 1);
    let i = set.get("v6").unwrap().family(Family::V6).unwrap();
    assert_eq!(i.allocated(), 1 << 60);
    assert_eq!(i.free(), 0);
    assert_eq!(i.stored_entries(), 1);
}

// ---------------------------------------------------------------- properties

/// A random valid pool: up to three disjoint IPv4 CIDRs (/20../26) in 10.x.0.0, an IPv6 /64
/// sometimes, block sizes /26../32, exclusions inside the CIDRs.
fn arb_spec() -> impl Strategy<Value = PoolSpec> {
    (
        proptest::collection::btree_set(0u8..8, 1..4),
        20u8..=26,
        26u8..=32,
        any::<bool>(),
        proptest::collection::vec((any::<u32>(), 24u8..=32), 0..4),
    )
        .prop_map(|(slots, cidr_prefix, block, v6, excl)| {
            let cidrs: Vec<IpNet> = slots
                .iter()
                .map(|&s| format!("10.{}.0.0/{cidr_prefix}", s * 16).parse().unwrap())
                .collect();
            let exclude: Vec<IpNet> = excl
                .iter()
                .map(|&(x, p)| {
                    let c = cidrs[x as usize % cidrs.len()];
                    let (lo, hi) = super::span(&c);
                    let a = lo + (x as u128 % (hi - lo + 1));
                    super::make_net(Family::V4, a, p).trunc()
                })
                .collect();
            let mut all = cidrs;
            if v6 {
                all.push(net("fd00:1::/64"));
            }
            PoolSpec::new("prop", all)
                .with_block_size(PerFamily { v4: block, v6: 124 })
                .with_exclude(exclude)
        })
        .prop_filter("every block excluded", |s| s.validate().is_ok())
}

#[derive(Debug, Clone)]
enum Op {
    Claim(Family, u128),
    Release(usize),
    ClaimBlock(Family, u128),
}

fn arb_ops() -> impl Strategy<Value = Vec<Op>> {
    let fam = prop_oneof![3 => Just(Family::V4), 1 => Just(Family::V6)];
    proptest::collection::vec(
        prop_oneof![
            4 => (fam.clone(), any::<u128>()).prop_map(|(f, s)| Op::Claim(f, s)),
            2 => any::<usize>().prop_map(Op::Release),
            1 => (fam, any::<u128>()).prop_map(|(f, s)| Op::ClaimBlock(f, s)),
        ],
        0..300,
    )
}

/// Applies `ops` to `p`, checking the invariants against a model; returns the results.
fn run(p: &mut PoolIndex, ops: &[Op]) -> Result<Vec<Option<IpNet>>, TestCaseError> {
    let spec = p.spec().clone();
    let mut held: Vec<IpNet> = Vec::new();
    let mut model: BTreeSet<IpNet> = BTreeSet::new();
    let mut out = Vec::new();
    for op in ops {
        let r = match *op {
            Op::Claim(f, start) => match p.claim(f, start) {
                Ok(b) => {
                    prop_assert!(model.insert(b), "{b} handed out twice");
                    held.push(b);
                    Some(b)
                }
                Err(PoolError::Exhausted { .. }) => {
                    let i = p.family(f).unwrap();
                    prop_assert_eq!(i.free(), 0);
                    None
                }
                Err(PoolError::FamilyNotServed { .. }) => None,
                Err(e) => return Err(TestCaseError::fail(format!("{e}"))),
            },
            Op::Release(k) if !held.is_empty() => {
                let b = held.swap_remove(k % held.len());
                prop_assert_eq!(p.release(&b), Ok(true));
                model.remove(&b);
                // release then claim of that very block round-trips
                prop_assert_eq!(p.claim_block(&b), Ok(()));
                prop_assert_eq!(p.release(&b), Ok(true));
                prop_assert!(!p.is_taken(&b));
                None
            }
            Op::Release(_) => None,
            Op::ClaimBlock(f, x) => {
                let Some(i) = p.family(f) else { continue };
                let c: Vec<IpNet> = i.cidrs().collect();
                let cidr = c[(x % c.len() as u128) as usize];
                let (lo, hi) = super::span(&cidr);
                let a = lo + (x >> 8) % (hi - lo + 1);
                let b = super::make_net(f, a, i.block_prefix()).trunc();
                match p.claim_block(&b) {
                    Ok(()) => {
                        prop_assert!(model.insert(b));
                        held.push(b);
                        Some(b)
                    }
                    Err(PoolError::BlockTaken { .. }) => {
                        prop_assert!(model.contains(&b));
                        None
                    }
                    Err(PoolError::BlockExcluded { .. }) => {
                        prop_assert!(
                            spec.exclude.iter().any(|e| overlaps(e, &b)) || b.prefix_len() == 32
                        );
                        None
                    }
                    Err(e) => return Err(TestCaseError::fail(format!("{e}"))),
                }
            }
        };
        out.push(r);
        for f in Family::ALL {
            if let Some(i) = p.family(f) {
                prop_assert_eq!(i.free() + i.allocated(), i.capacity());
                let a = i.addresses();
                prop_assert_eq!(a.free + a.allocated, a.capacity);
            }
        }
    }
    // exclusions respected, network and broadcast never usable
    for b in &model {
        prop_assert!(!spec.exclude.iter().any(|e| overlaps(e, b)), "{b} excluded");
        let i = p.family(super::family_of(b)).unwrap();
        if let IpNet::V4(_) = b {
            for c in i.cidrs().filter(|c| c.prefix_len() <= 30) {
                for a in i.usable_addresses(b).unwrap().iter() {
                    prop_assert!(a != c.network() && a != c.broadcast());
                }
            }
        }
    }
    let taken: BTreeSet<IpNet> = Family::ALL
        .iter()
        .filter_map(|&f| p.family(f))
        .flat_map(|i| i.iter_taken().collect::<Vec<_>>())
        .collect();
    prop_assert_eq!(&taken, &model);
    Ok(out)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// No block is handed out twice; free + allocated = capacity after every step; release then
    /// claim round-trips; exclusions are respected; the index agrees with a model set.
    #[test]
    fn index_invariants(spec in arb_spec(), ops in arb_ops()) {
        let mut p = PoolIndex::new(&spec).unwrap();
        run(&mut p, &ops)?;
    }

    /// The dense, sparse and runs layouts take the same decisions.
    #[test]
    fn dense_sparse_and_runs_layouts_agree(spec in arb_spec(), ops in arb_ops()) {
        let mut d = PoolIndex::with_layout(&spec, Layout::Dense).unwrap();
        let mut s = PoolIndex::with_layout(&spec, Layout::Sparse).unwrap();
        let mut r = PoolIndex::with_layout(&spec, Layout::Runs).unwrap();
        let want = run(&mut d, &ops)?;
        prop_assert_eq!(&want, &run(&mut s, &ops)?);
        prop_assert_eq!(&want, &run(&mut r, &ops)?);
    }

    /// Claiming until exhaustion hands out exactly `capacity` distinct blocks.
    #[test]
    fn claims_until_exhausted_give_capacity(spec in arb_spec(), start in any::<u128>()) {
        let mut p = PoolIndex::new(&spec).unwrap();
        let cap = p.family(Family::V4).unwrap().capacity();
        let mut seen = BTreeSet::new();
        while let Ok(b) = p.claim(Family::V4, start) {
            prop_assert!(seen.insert(b));
        }
        prop_assert_eq!(seen.len() as u128, cap);
    }

    /// Rebuilding from the claimed set gives an identical index, with no findings.
    #[test]
    fn rebuild_round_trips(spec in arb_spec(), ops in arb_ops()) {
        let mut set = PoolSet::new(vec![spec.clone(), pool("other", &["192.168.0.0/16"])]);
        for op in &ops {
            if let Op::Claim(f, s) = *op {
                let _ = set.get_mut("prop").unwrap().claim(f, s);
                let _ = set.get_mut("other").unwrap().claim(Family::V4, s);
            }
        }
        let mut blocks: Vec<(String, IpNet)> = Vec::new();
        for p in set.valid() {
            for f in Family::ALL {
                if let Some(i) = p.family(f) {
                    blocks.extend(i.iter_taken().map(|b| (p.name().to_string(), b)));
                }
            }
        }
        let names: Vec<String> = blocks.iter().map(|(_, b)| block_name(b)).collect();
        let mut fresh = PoolSet::new(vec![spec, pool("other", &["192.168.0.0/16"])]);
        let recs = blocks.iter().zip(&names).enumerate().map(|(k, ((p, b), n))| BlockRecord {
            key: k, name: n, pool: p, cidr: *b,
        });
        let report = fresh.rebuild(recs);
        prop_assert!(report.findings.is_empty(), "{:?}", report.findings);
        prop_assert_eq!(report.indexed, blocks.len());
        for name in ["prop", "other"] {
            prop_assert_eq!(fresh.get(name).unwrap(), set.get(name).unwrap());
        }
    }

    /// Arbitrary records never panic; whatever they are, a later claim never overlaps one of
    /// them, and the counts still add up.
    #[test]
    fn rebuild_of_arbitrary_records_is_safe(
        spec in arb_spec(),
        recs in proptest::collection::vec((0u8..3, any::<u32>(), 20u8..=32, any::<bool>()), 0..40),
    ) {
        let mut set = PoolSet::new(vec![spec.clone()]);
        let nets: Vec<(String, IpNet)> = recs.iter().map(|&(p, a, len, canon)| {
            let a = (10u32 << 24) | (a & 0x00ff_ffff) & !0x000f_0000 | ((a >> 28) << 20);
            let n = super::make_net(Family::V4, a as u128, len);
            let pool = ["prop", "nope", "prop"][p as usize].to_string();
            (pool, if canon { n.trunc() } else { n })
        }).collect();
        let names: Vec<String> = nets.iter().map(|(_, n)| block_name(n)).collect();
        let report = set.rebuild(nets.iter().zip(&names).map(|((p, n), name)| BlockRecord {
            key: (), name, pool: p, cidr: *n,
        }));
        let _ = report;
        if let Ok(p) = set.get_mut("prop") {
            let i = p.family_mut(Family::V4).unwrap();
            prop_assert_eq!(i.free() + i.allocated(), i.capacity());
            while let Some(b) = i.claim(0) {
                for (_, n) in &nets {
                    prop_assert!(!overlaps(&b, n), "claimed {} overlapping record {}", b, n);
                }
            }
        }
    }

    /// Arbitrary strings as CIDRs never panic; errors name the pool and the value.
    #[test]
    fn arbitrary_cidr_strings_give_typed_errors(
        s in prop_oneof!["\\PC{0,40}", "[0-9]{1,3}(\\.[0-9]{1,3}){3}/[0-9]{1,3}", "[0-9a-f:]{2,20}/[0-9]{1,3}"],
        name in "[a-z]{1,8}",
    ) {
        match PoolSpec::parse(&name, &[s.as_str()], DEFAULT_BLOCK_SIZE, &[]) {
            Ok(spec) => { PoolIndex::new(&spec).unwrap(); }
            Err(e) => {
                prop_assert_eq!(e.pool(), name.as_str());
                prop_assert!(e.to_string().contains(&name));
            }
        }
        prop_assert!(parse_cidr(&name, Field::Exclude, &s).is_ok() == s.trim().parse::<IpNet>().is_ok_and(|n| n.trunc() == n));
    }

    /// Arbitrary prefix lengths and exclusions never panic: either a typed error naming the
    /// pool, or a pool whose claims work.
    #[test]
    fn arbitrary_prefix_lengths_never_panic(
        a in any::<u128>(),
        v6 in any::<bool>(),
        cidr_len in 0u8..=140,
        b4 in 0u8..=40,
        b6 in 0u8..=140,
        ex in proptest::option::of((any::<u128>(), 0u8..=128)),
    ) {
        let f = if v6 { Family::V6 } else { Family::V4 };
        let max = super::max_prefix(f);
        let cidr = super::make_net(f, a, cidr_len.min(max)).trunc();
        let text = if cidr_len > max { format!("{}/{}", cidr.addr(), cidr_len) } else { cidr.to_string() };
        let excl: Vec<String> = ex.iter().map(|&(x, l)| super::make_net(f, x, l.min(max)).trunc().to_string()).collect();
        match PoolSpec::parse("p", &[text], PerFamily { v4: b4, v6: b6 }, &excl) {
            Ok(spec) => {
                let mut p = PoolIndex::new(&spec).unwrap();
                let b = p.claim(f, a).unwrap();
                prop_assert!(cidr.contains(&b));
                prop_assert_eq!(p.release(&b), Ok(true));
            }
            Err(e) => prop_assert_eq!(e.pool(), "p"),
        }
    }
}
