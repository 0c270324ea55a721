//! Every bundled hardware profile, model, kernel profile and NCCL table loads, cites its sources,
//! and the files on disk are exactly the bundled set (so a new file cannot be forgotten).

use fcp::hardware::{bundled, Hardware, KernelProfile, NcclTable, NUMERIC_FIELDS};
use fcp::Model;

fn on_disk(dir: &str, ext: &str) -> Vec<String> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut names: Vec<String> = std::fs::read_dir(&root)
        .unwrap()
        .filter_map(|e| {
            let p = e.ok()?.path();
            (p.extension()?.to_str()? == ext).then(|| p.file_stem()?.to_str().map(String::from))?
        })
        .collect();
    names.sort();
    names
}

fn sorted(v: Vec<&str>) -> Vec<String> {
    let mut v: Vec<String> = v.into_iter().map(String::from).collect();
    v.sort();
    v
}

#[test]
fn bundled_sets_match_files() {
    assert_eq!(
        on_disk("configs/hardware", "toml"),
        sorted(bundled::names(bundled::HARDWARE))
    );
    assert_eq!(
        on_disk("configs/models", "toml"),
        sorted(bundled::names(bundled::MODELS))
    );
    assert_eq!(
        on_disk("kernels-profile", "csv"),
        sorted(bundled::names(bundled::KERNEL_PROFILES))
    );
    assert_eq!(
        on_disk("configs/nccl", "csv"),
        sorted(bundled::names(bundled::NCCL_TABLES))
    );
}

#[test]
fn every_bundled_file_loads_and_cites() {
    for name in bundled::names(bundled::HARDWARE) {
        let hw = Hardware::load(name).unwrap();
        for f in NUMERIC_FIELDS {
            assert!(
                hw.source_of(f).is_some_and(|s| !s.is_empty()),
                "{name}: {f}"
            );
        }
        hw.kernel_profile().unwrap();
        hw.nccl_table().unwrap();
        // Loading by path gives the same profile.
        let path = format!(
            "{}/configs/hardware/{name}.toml",
            env!("CARGO_MANIFEST_DIR")
        );
        assert_eq!(Hardware::load(&path).unwrap(), hw);
    }
    for name in bundled::names(bundled::MODELS) {
        Model::load(name).unwrap();
    }
    for name in bundled::names(bundled::KERNEL_PROFILES) {
        let p = KernelProfile::load(name).unwrap();
        assert!(p.rows().iter().all(|r| !r.source.is_empty()));
        let path = format!("{}/kernels-profile/{name}.csv", env!("CARGO_MANIFEST_DIR"));
        assert_eq!(KernelProfile::load(&path).unwrap().rows(), p.rows());
    }
    for name in bundled::names(bundled::NCCL_TABLES) {
        NcclTable::load(name).unwrap();
    }
}
