//! `lnet-router`: ulnet's LNet daemon. The daemon itself is the library's
//! [`router::daemon`] (arguments, configuration, NIs and their loops, the control socket,
//! signals); this binary adds the process-wide allocator and hands it the command line.

use std::process::ExitCode;

use clap::Parser;
use router::daemon::Args;

/// jemalloc rather than glibc's malloc: after a burst (tens of thousands of messages or peers),
/// the tables give their room back (`lnd::trim`), but glibc keeps the freed pages of an NI
/// thread's arena as long as anything above them lives, so the daemon's RSS stayed at its peak
/// (20,000 pings to unreachable peers: 8 -> 90 MB, and 77 MB for good). jemalloc returns freed
/// pages to the system after a short decay.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's purging threads: one is enough for a daemon whose allocations come from a few NI
/// threads (jemalloc's default is one per CPU: 64 idle threads in `ps` on a 64-core router).
const ALLOCATOR_THREADS: usize = 1;

/// Caps jemalloc's background threads before any other thread starts (they are created
/// lazily, per arena in use; the allocator's build turns them on). A failure only costs idle
/// threads: logged, never fatal.
fn limit_allocator_threads() -> Result<(), String> {
    tikv_jemalloc_ctl::max_background_threads::write(ALLOCATOR_THREADS).map_err(|e| e.to_string())
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.print_man {
        return print_man();
    }
    match router::daemon::run(args, limit_allocator_threads) {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("lnet-router: {}", f.message);
            ExitCode::from(f.status)
        }
    }
}

/// `--print-man`: this manual page (roff, section 8) on standard output.
fn print_man() -> ExitCode {
    let mut out = Vec::new();
    let cmd = <Args as clap::CommandFactory>::command();
    if let Err(e) = clap_mangen::Man::new(cmd).section("8").render(&mut out) {
        eprintln!("lnet-router: man page: {e}");
        return ExitCode::FAILURE;
    }
    let _ = std::io::Write::write_all(&mut std::io::stdout(), &out);
    ExitCode::SUCCESS
}
