// The library is also NCCL's profiler plugin, which NCCL dlcloses when its last
// communicator is destroyed: never let that unmap code a writer thread still runs.
fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,nodelete");
}
