//! `/init` of the hawser initramfs. All logic lives in the library; see `hawser_init::boot`.

fn main() {
    hawser_init::boot::run()
}
