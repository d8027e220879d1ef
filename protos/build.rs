//! Generates the `ringserve.v1` gRPC code into `OUT_DIR` with a vendored `protoc`, so a fresh machine
//! needs nothing from the system package manager.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: build scripts are single-threaded; nothing else reads the environment concurrently.
    unsafe { std::env::set_var("PROTOC", protoc) };
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .file_descriptor_set_path(out_dir.join("ringserve_v1_descriptor.bin"))
        .compile_protos(&["proto/inference.proto"], &["proto"])?;
    println!("cargo:rerun-if-changed=proto/inference.proto");
    Ok(())
}
