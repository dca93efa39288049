// Embeds the libtorch library directory as an rpath so `skein` runs without LD_LIBRARY_PATH.
fn main() {
    if let Ok(dir) = std::env::var("DEP_TCH_LIBTORCH_LIB") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
}
