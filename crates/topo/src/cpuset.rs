//! A set of CPUs (Linux PU numbers, what `sched_setaffinity` takes), kept as a sorted list, and
//! the kernel's "cpulist" text form (`0-23,48-71`) both ways.

use std::fmt;

/// Sorted, duplicate-free PU numbers.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CpuSet(Vec<u32>);

impl CpuSet {
    /// The set of `cpus` (any order, duplicates dropped).
    pub fn new(mut cpus: Vec<u32>) -> CpuSet {
        cpus.sort_unstable();
        cpus.dedup();
        CpuSet(cpus)
    }

    /// Parse the kernel's cpulist form: comma-separated numbers and inclusive ranges
    /// (`0-3,8,10-11`); an empty string is the empty set.
    pub fn parse_list(text: &str) -> Option<CpuSet> {
        let mut cpus = Vec::new();
        for part in text.trim().split(',').filter(|p| !p.is_empty()) {
            match part.split_once('-') {
                Some((a, b)) => {
                    let (a, b): (u32, u32) = (a.parse().ok()?, b.parse().ok()?);
                    if b < a || b - a > 1 << 20 {
                        return None;
                    }
                    cpus.extend(a..=b);
                }
                None => cpus.push(part.parse().ok()?),
            }
        }
        Some(CpuSet::new(cpus))
    }

    pub fn as_slice(&self) -> &[u32] {
        &self.0
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn first(&self) -> Option<u32> {
        self.0.first().copied()
    }

    pub fn contains(&self, cpu: u32) -> bool {
        self.0.binary_search(&cpu).is_ok()
    }

    /// Whether every CPU of `other` is in `self`.
    pub fn contains_all(&self, other: &CpuSet) -> bool {
        other.0.iter().all(|&c| self.contains(c))
    }

    pub fn union(&self, other: &CpuSet) -> CpuSet {
        CpuSet::new(self.0.iter().chain(&other.0).copied().collect())
    }
}

impl fmt::Display for CpuSet {
    /// The cpulist form, ranges collapsed: `0-23,48-71`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut i = 0;
        while i < self.0.len() {
            let start = self.0[i];
            let mut end = start;
            while i + 1 < self.0.len() && self.0[i + 1] == end + 1 {
                i += 1;
                end += 1;
            }
            if start != self.0[0] {
                f.write_str(",")?;
            }
            if end == start {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{end}")?;
            }
            i += 1;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpulists_round_trip() {
        for text in ["", "0", "0-3", "0-23,48-71", "1,3,5-6"] {
            let set = CpuSet::parse_list(text).unwrap();
            assert_eq!(set.to_string(), text);
        }
        assert_eq!(CpuSet::parse_list("3-1"), None);
        assert_eq!(CpuSet::parse_list("a"), None);
        assert_eq!(CpuSet::parse_list("0-3\n").unwrap().len(), 4);
    }

    #[test]
    fn containment() {
        let all = CpuSet::parse_list("0-7").unwrap();
        assert!(all.contains_all(&CpuSet::parse_list("2,5").unwrap()));
        assert!(!all.contains_all(&CpuSet::parse_list("2,8").unwrap()));
    }
}
