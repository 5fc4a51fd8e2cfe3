fn main() {
    eprintln!("asya-webhook-bench: not yet implemented");
}
