//! Compiles the `.proto` files with protox (pure Rust: no `protoc` on the build host).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["proto/evidence.proto"];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let descriptors = protox::compile(files, ["proto"])?;
    prost_build::Config::new().compile_fds(descriptors)?;
    Ok(())
}
