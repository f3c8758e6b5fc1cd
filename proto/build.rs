//! Compiles the `.proto` files with protox (pure Rust: no `protoc` on the build host).
//! Messages come from prost; the join and init services' tonic code is generated as well and
//! compiled only with the `grpc` feature (PID 1's evidence path needs no gRPC).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/evidence.proto",
        "proto/join.proto",
        "proto/init.proto",
        "proto/vpn.proto",
        "proto/admin.proto",
        "proto/attest.proto",
    ];
    for f in files {
        println!("cargo:rerun-if-changed={f}");
    }
    let evidence = protox::compile(["proto/evidence.proto"], ["proto"])?;
    prost_build::Config::new().compile_fds(evidence)?;
    let services = protox::compile(
        [
            "proto/join.proto",
            "proto/init.proto",
            "proto/vpn.proto",
            "proto/admin.proto",
            "proto/attest.proto",
        ],
        ["proto"],
    )?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // Connections are made over aTLS with `connect_with_connector`, never by URL.
        .build_transport(false)
        .compile_fds(services)?;
    Ok(())
}
