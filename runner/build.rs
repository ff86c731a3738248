fn main() {
    for arg in std::env::var("DEP_MLX_LINK_ARGS")
        .unwrap_or_default()
        .split('\u{1f}')
    {
        println!("cargo:rustc-link-arg={arg}");
    }
}
