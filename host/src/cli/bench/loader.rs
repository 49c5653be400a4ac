//! `lsgd-host bench loader`: image decoding (images/s) against training (samples/s) on the
//! same image folder.

use std::path::PathBuf;

use anyhow::Result;
use clap::Args;

use super::{emit, threads_or_all};
use crate::bench::loader;
use crate::cli::trace::Format;
use crate::model::Arch;
use crate::train::augment::Augment;

/// Arguments of `bench loader`.
#[derive(Args, Debug)]
pub struct LoaderArgs {
    /// An image folder (`train/CLASS/*.jpg` …); default: a synthetic one.
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Synthetic images to write without --data-dir.
    #[arg(long, default_value_t = 512)]
    images: usize,
    /// Side of the images made.
    #[arg(long, default_value_t = 224, value_name = "PX")]
    image_size: u32,
    /// Training augmentation.
    #[arg(long, value_enum, default_value_t = Augment::Imagenet)]
    augment: Augment,
    /// Decoding threads.
    #[arg(long, default_value_t = 2, value_name = "N")]
    loader_threads: usize,
    /// Network trained.
    #[arg(long, value_enum, default_value_t = Arch::Resnet)]
    model: Arch,
    /// ResNet depth.
    #[arg(long, default_value_t = 20)]
    depth: u32,
    /// Global batch.
    #[arg(long, default_value_t = 64)]
    global_batch: u32,
    /// libtorch threads of the training run (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Timed steps.
    #[arg(long, default_value_t = 10)]
    steps: u64,
    /// Untimed steps first.
    #[arg(long, default_value_t = 2)]
    warmup_steps: u64,
    /// `json` prints the measurements as JSON.
    #[arg(long, value_enum)]
    format: Option<Format>,
}

impl LoaderArgs {
    /// Runs `bench loader`.
    pub fn run(self) -> Result<()> {
        let setup = loader::Setup {
            data: self.data_dir,
            images: self.images,
            image_size: self.image_size,
            augment: self.augment,
            loader_threads: self.loader_threads,
            batch: self.global_batch,
            steps: self.steps,
            warmup: self.warmup_steps,
            model: self.model,
            depth: self.depth,
            threads: threads_or_all(self.threads),
        };
        let report = loader::run(&setup)?;
        emit(self.format, &report, |out| {
            loader::print(&setup, &report, out)
        })
    }
}
