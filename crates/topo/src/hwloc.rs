//! The hwloc reader (feature `hwloc`, through `hwlocality`): this machine, an XML snapshot, or
//! a synthetic description, turned into the flat object list [`Topology::assemble`] nests.
//! Distances come from the `NUMALatency` matrix (the ACPI SLIT Linux reports, or what a
//! snapshot carries).

use crate::tree::{Kind, Obj};
use crate::{CpuSet, TopoError, Topology};
use hwlocality::object::attributes::ObjectAttributes;
use hwlocality::object::types::ObjectType;
use hwlocality::Topology as Hw;
use std::path::Path;

fn err(e: impl std::fmt::Display) -> TopoError {
    TopoError::Hwloc(e.to_string())
}

pub fn this_machine() -> Result<Topology, TopoError> {
    convert(&Hw::new().map_err(err)?, "hwloc")
}

pub fn from_xml_file(path: &Path) -> Result<Topology, TopoError> {
    let parse = |e: &dyn std::fmt::Display| TopoError::Parse {
        path: path.display().to_string(),
        what: format!("not an hwloc XML topology ({e})"),
    };
    // Depending on hwloc's XML backend (libxml2 or its own), a malformed file is refused when
    // it is set or only when the topology is loaded: both are the file's fault.
    let hw = Hw::builder().from_xml_file(path).map_err(|e| parse(&e))?;
    convert(&hw.build().map_err(|e| parse(&e))?, &path.display().to_string())
}

pub fn from_synthetic(description: &str) -> Result<Topology, TopoError> {
    let hw = Hw::builder().from_synthetic(description).map_err(|e| TopoError::Parse {
        path: description.to_string(),
        what: format!(
            "neither a file, a directory nor an hwloc synthetic description like \
             \"pack:2 numa:1 l3:4 core:8 pu:2\" ({e})"
        ),
    })?;
    convert(&hw.build().map_err(err)?, &format!("synthetic \"{description}\""))
}

fn convert(hw: &Hw, source: &str) -> Result<Topology, TopoError> {
    const LEVELS: [(ObjectType, Kind); 6] = [
        (ObjectType::Package, Kind::Package),
        (ObjectType::NUMANode, Kind::NumaNode),
        (ObjectType::L3Cache, Kind::L3),
        (ObjectType::L2Cache, Kind::L2),
        (ObjectType::Core, Kind::Core),
        (ObjectType::PU, Kind::Pu),
    ];
    let mut flat = Vec::new();
    for (ty, kind) in LEVELS {
        for o in hw.objects_with_type(ty) {
            let cpus = o
                .cpuset()
                .map(|s| CpuSet::new(s.iter_set().map(|i| usize::from(i) as u32).collect()))
                .unwrap_or_default();
            let bytes = match o.attributes() {
                Some(ObjectAttributes::NUMANode(a)) => a.local_memory().map_or(0, |m| m.get()),
                Some(ObjectAttributes::Cache(c)) => c.size().map_or(0, |s| s.get()),
                _ => 0,
            };
            let os_index = if matches!(kind, Kind::L3 | Kind::L2) { None } else { o.os_index().map(|i| i as u32) };
            flat.push(Obj::leaf(kind, os_index, cpus, bytes));
        }
    }
    Topology::assemble(source.to_string(), flat, numa_latency(hw)?)
}

/// The NUMA latency matrix in node OS-number order, if the topology has one covering every node.
fn numa_latency(hw: &Hw) -> Result<Option<Vec<Vec<u32>>>, TopoError> {
    let mut nodes: Vec<u32> =
        hw.objects_with_type(ObjectType::NUMANode).filter_map(|o| o.os_index().map(|i| i as u32)).collect();
    nodes.sort_unstable();
    for d in hw.distances(None).map_err(err)? {
        if d.name().is_some_and(|n| n.to_bytes() != b"NUMALatency") {
            continue;
        }
        let objs: Vec<Option<u32>> = d
            .objects()
            .map(|o| o.filter(|o| o.object_type() == ObjectType::NUMANode).and_then(|o| o.os_index()).map(|i| i as u32))
            .collect();
        let Some(objs) = objs.into_iter().collect::<Option<Vec<u32>>>() else { continue };
        let mut sorted = objs.clone();
        sorted.sort_unstable();
        if sorted != nodes {
            continue;
        }
        let n = objs.len();
        let pos: Vec<usize> = nodes.iter().map(|id| objs.iter().position(|o| o == id).unwrap_or(0)).collect();
        let v = d.distances();
        let matrix = pos.iter().map(|&i| pos.iter().map(|&j| v[i * n + j] as u32).collect()).collect();
        return Ok(Some(matrix));
    }
    Ok(None)
}
