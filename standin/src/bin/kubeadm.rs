//! `kubeadm` STAND-IN (not Kubernetes): see the hawser-standin crate.

use hawser_standin::{KUBEADM_LABEL, StandinEnv, error_chain, kubeadm, labelled};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match kubeadm::run(&args, &StandinEnv::from_process()) {
        Ok(out) => {
            for line in &out.stderr {
                eprintln!("{line}");
            }
            for line in &out.stdout {
                println!("{line}");
            }
        }
        Err(e) => {
            eprintln!(
                "{}",
                labelled(KUBEADM_LABEL, &format!("error: {}", error_chain(&e)))
            );
            std::process::exit(e.exit_code());
        }
    }
}
