//! `tidepool-cni`: the CNI IPAM plugin (not built yet; issue 15).

fn main() {
    eprintln!("tidepool-cni: not available yet");
    std::process::exit(1);
}
