//! Writes the generated CRDs to `deploy/crds/` (or to the directory given as the first argument),
//! or prints them with `--stdout`: `cargo run -p smolvm-api --example crdgen` (`make generate`).
//!
//! An example of this crate, so that it builds with the dev-dependencies' k8s-openapi version
//! feature while the library itself leaves that choice to the binaries.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let arg = std::env::args().nth(1);
    let files = smolvm_api::crd::render()?;
    if arg.as_deref() == Some("--stdout") {
        for (_, body) in &files {
            print!("---\n{body}");
        }
        return Ok(());
    }
    let dir = arg.map(PathBuf::from).unwrap_or_else(|| PathBuf::from("deploy/crds"));
    std::fs::create_dir_all(&dir)?;
    for (name, body) in &files {
        let path = dir.join(name);
        std::fs::write(&path, body)?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
