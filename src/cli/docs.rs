//! `dedupd completions SHELL` and `dedupd man --out DIR`: the shell
//! completions and man pages the Debian package installs
//! (deploy/debian/build.sh), from the command line's own definition, so
//! they never drift from it.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use clap::CommandFactory;

/// Prints `shell`'s completions for the command line `C`.
pub fn completions<C: CommandFactory>(shell: clap_complete::Shell) -> anyhow::Result<ExitCode> {
    let mut cmd = C::command();
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut cmd, "dedupd", &mut out);
    super::out::out!("{}", String::from_utf8_lossy(&out))?;
    Ok(ExitCode::SUCCESS)
}

/// Writes `dedupd.1` and a page per subcommand (`dedupd-serve.1`, …, and
/// `dedupd-events-list.1` for the nested ones) into `dir`.
pub fn man_pages<C: CommandFactory>(dir: &Path) -> anyhow::Result<ExitCode> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let cmd = C::command().name("dedupd");
    let written = write_pages(&cmd, "dedupd", dir)?;
    super::out::outln!("wrote {written} man pages into {}", dir.display())?;
    Ok(ExitCode::SUCCESS)
}

/// Writes the page of `cmd` (called `name`) and of each subcommand below
/// it; how many.
fn write_pages(cmd: &clap::Command, name: &str, dir: &Path) -> anyhow::Result<usize> {
    let cmd = cmd
        .clone()
        .name(name.to_owned())
        .bin_name(name.replace('-', " "));
    let mut page = Vec::new();
    clap_mangen::Man::new(cmd.clone())
        .render(&mut page)
        .with_context(|| format!("cannot render the page of {name}"))?;
    let path = dir.join(format!("{name}.1"));
    // A page already there is replaced, never written through: a link
    // planted in the directory leads nowhere.
    match std::fs::remove_file(&path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(e).with_context(|| format!("cannot replace {}", path.display()));
        }
        _ => {}
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
        .and_then(|mut f| std::io::Write::write_all(&mut f, &page))
        .with_context(|| format!("cannot write {}", path.display()))?;
    let mut written = 1;
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        if sub.get_name() == "help" {
            continue;
        }
        written += write_pages(sub, &format!("{name}-{}", sub.get_name()), dir)?;
    }
    Ok(written)
}
