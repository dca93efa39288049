//! A long-lived child process speaking lines on stdin/stdout: the transport of reward workers
//! and environment workers.
//!
//! Each process has a writer and a reader thread, so a caller only ever waits on a channel
//! with a deadline: a process that hangs, stops reading, or floods its output can never block
//! a caller past its timeout. The process runs in its own process group; dropping a
//! [`LineProcess`] closes its stdin, gives it [`EXIT_GRACE`] to exit, then kills the group.
//! A group is also killed when skein exits or is stopped by a signal ([`reaper`]).

pub mod reaper;

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

/// Longest line accepted from a process; longer means it is not speaking the protocol.
pub const MAX_LINE_BYTES: u64 = 16 << 20;
/// How long a process gets to exit by itself once its stdin is closed.
pub const EXIT_GRACE: Duration = Duration::from_millis(500);

/// Why no line came.
#[derive(Debug, Clone, PartialEq)]
pub enum LineError {
    /// The process is gone or unusable (exit, EOF, broken pipe, an over-long line): the detail.
    Closed(String),
    /// Nothing within the deadline.
    Timeout,
}

enum Event {
    Line(String),
    Closed(String),
}

/// One running process and its two pipe threads.
pub struct LineProcess {
    child: Child,
    /// Its process group, killed with skein until it is reaped here.
    recorded: Option<reaper::Recorded>,
    /// Whether it has written a line yet (until then it may still be starting up).
    answered: bool,
    to_stdin: Sender<String>,
    from_stdout: Receiver<Event>,
    /// Give it [`EXIT_GRACE`] to exit on its own when dropped (not when killed).
    grace: bool,
}

impl LineProcess {
    /// Starts `command` (program and arguments) with piped stdin/stdout and inherited stderr;
    /// `thread_name` names its pipe threads. The error is a one-line reason.
    pub fn spawn(command: &[String], thread_name: &str) -> Result<LineProcess, String> {
        Self::spawn_with_env(command, thread_name, &[])
    }

    /// [`LineProcess::spawn`] with extra environment variables.
    pub fn spawn_with_env(
        command: &[String],
        thread_name: &str,
        env: &[(&str, String)],
    ) -> Result<LineProcess, String> {
        let (program, args) = command
            .split_first()
            .ok_or_else(|| "the command is empty".to_string())?;
        let mut cmd = Command::new(program);
        cmd.args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        #[cfg(unix)]
        {
            use std::os::unix::process::CommandExt;
            // Its own process group, so a kill reaches what a wrapper script started, too.
            cmd.process_group(0);
        }
        let mut child = reaper::spawn(cmd).map_err(|e| e.to_string())?;
        let recorded = Some(reaper::Recorded::new(child.id()));
        let (stdin, stdout) = match (child.stdin.take(), child.stdout.take()) {
            (Some(i), Some(o)) => (i, o),
            _ => {
                kill(&mut child, recorded);
                return Err("its stdin/stdout pipes were not created".into());
            }
        };
        let (to_stdin, lines_in) = channel();
        let (lines_out, from_stdout) = channel();
        let threads = std::thread::Builder::new()
            .name(format!("{thread_name}-in"))
            .spawn(move || write_lines(stdin, lines_in))
            .and_then(|_| {
                std::thread::Builder::new()
                    .name(format!("{thread_name}-out"))
                    .spawn(move || read_lines(stdout, lines_out))
            });
        if let Err(e) = threads {
            kill(&mut child, recorded);
            return Err(format!("cannot start its pipe threads: {e}"));
        }
        Ok(LineProcess {
            child,
            recorded,
            answered: false,
            to_stdin,
            from_stdout,
            grace: true,
        })
    }

    /// Queues `line` (which must end with a newline) for the process's stdin. Never blocks; a
    /// process that is gone shows up on the next [`LineProcess::recv`].
    pub fn send(&self, line: String) {
        let _ = self.to_stdin.send(line);
    }

    /// A sender of lines to this process's stdin that outlives a borrow of it (for lines that
    /// get no answer). Once the process is dropped, sending on it does nothing.
    pub fn sender(&self) -> Sender<String> {
        self.to_stdin.clone()
    }

    /// Kills the process group now, without the grace a drop gives (for a process that
    /// misbehaved).
    pub fn kill(mut self) {
        self.grace = false;
    }

    /// Whether the process has not exited (it may still be about to). Once it has, what it
    /// left running in its group is killed.
    pub fn running(&mut self) -> bool {
        if !has_exited(&self.child) {
            return true;
        }
        kill(&mut self.child, self.recorded.take());
        false
    }

    /// How the process ended ("exit status: 1", "signal: 9 (SIGKILL)"), once
    /// [`running`](Self::running) has found it gone; None while it runs.
    pub fn exit_status(&mut self) -> Option<String> {
        self.child.try_wait().ok().flatten().map(|s| s.to_string())
    }

    /// Whether the process has written a line yet.
    pub fn answered(&self) -> bool {
        self.answered
    }

    /// The next non-empty line (trimmed), waiting at most `timeout`.
    pub fn recv(&mut self, timeout: Duration) -> Result<String, LineError> {
        let event = self.from_stdout.recv_timeout(timeout);
        match event {
            Ok(Event::Line(line)) => {
                self.answered = true;
                Ok(line)
            }
            Ok(Event::Closed(detail)) => Err(LineError::Closed(detail)),
            Err(RecvTimeoutError::Disconnected) => {
                Err(LineError::Closed("its output thread ended".into()))
            }
            Err(RecvTimeoutError::Timeout) => Err(LineError::Timeout),
        }
    }
}

impl Drop for LineProcess {
    fn drop(&mut self) {
        // Closing stdin (the writer thread ends when every sender is gone) asks it to exit;
        // whatever it leaves running in its group is killed either way.
        let (dead, _) = channel();
        self.to_stdin = dead;
        let deadline = Instant::now()
            + if self.grace {
                EXIT_GRACE
            } else {
                Duration::ZERO
            };
        while Instant::now() < deadline && !has_exited(&self.child) {
            std::thread::sleep(Duration::from_millis(5));
        }
        kill(&mut self.child, self.recorded.take());
    }
}

/// Whether the child has exited, without reaping it. An exited child that is not reaped yet (a
/// zombie) keeps its pid, and a pid is not given out again while it names a process, so its
/// process group's id cannot name another group until [`kill`] has signalled the group and
/// only then reaped the child. (Reaping first, as `Child::try_wait` does, would free the id
/// before the group is signalled.)
fn has_exited(child: &Child) -> bool {
    #[cfg(unix)]
    {
        let pid: libc::id_t = child.id();
        // SAFETY: waitid(2) writes only the siginfo_t we pass; WNOWAIT leaves the child
        // waitable, so `Child::wait` reaps it later.
        unsafe {
            let mut info: libc::siginfo_t = std::mem::zeroed();
            let flags = libc::WEXITED | libc::WNOHANG | libc::WNOWAIT;
            if libc::waitid(libc::P_PID, pid, &mut info, flags) != 0 {
                // No such child to wait for: it was reaped already.
                return true;
            }
            // WNOHANG: a zeroed si_pid means no state change yet.
            info.si_pid() != 0
        }
    }
    #[cfg(not(unix))]
    {
        let _ = child;
        false
    }
}

/// Kills the child's process group (or the child alone where there are no groups), forgets
/// the group, and reaps the child (which frees its id). Call it before the child is reaped
/// ([`has_exited`] does not reap). `recorded` is None once this has run: the group is not
/// signalled again, as its id may since name another.
fn kill(child: &mut Child, recorded: Option<reaper::Recorded>) {
    #[cfg(unix)]
    if recorded.is_some() {
        if let Ok(pid) = libc::pid_t::try_from(child.id()) {
            // SAFETY: kill(2) with a negative pid signals the process group we created for this
            // child; it touches no memory of ours.
            unsafe {
                libc::kill(-pid, libc::SIGKILL);
            }
        }
    }
    drop(recorded);
    let _ = child.kill();
    let _ = child.wait();
}

fn write_lines(mut stdin: ChildStdin, lines: Receiver<String>) {
    for line in lines {
        if stdin.write_all(line.as_bytes()).is_err() || stdin.flush().is_err() {
            return; // Broken pipe: the reader sees the process go and reports it.
        }
    }
}

fn read_lines(stdout: ChildStdout, events: Sender<Event>) {
    let mut reader = BufReader::new(stdout);
    loop {
        let mut buf = Vec::new();
        let n = match (&mut reader)
            .take(MAX_LINE_BYTES)
            .read_until(b'\n', &mut buf)
        {
            Ok(n) => n,
            Err(e) => {
                let _ = events.send(Event::Closed(format!("reading its stdout failed: {e}")));
                return;
            }
        };
        if n == 0 {
            let _ = events.send(Event::Closed("its stdout closed".into()));
            return;
        }
        if !buf.ends_with(b"\n") && n as u64 >= MAX_LINE_BYTES {
            let _ = events.send(Event::Closed(format!(
                "it wrote a line longer than {MAX_LINE_BYTES} bytes"
            )));
            return;
        }
        let line = String::from_utf8_lossy(&buf).trim().to_string();
        if line.is_empty() {
            continue;
        }
        if events.send(Event::Line(line)).is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Vec<String> {
        vec!["sh".into(), "-c".into(), script.into()]
    }

    #[test]
    fn lines_go_in_and_come_back_trimmed_and_in_order() {
        let mut p = LineProcess::spawn(&["cat".to_string()], "test-cat").unwrap();
        assert!(!p.answered());
        p.send("one\n".into());
        p.send("\n  two  \n".into());
        let t = Duration::from_secs(5);
        assert_eq!(p.recv(t), Ok("one".into()));
        assert_eq!(p.recv(t), Ok("two".into()));
        assert!(p.answered());
        assert_eq!(p.recv(Duration::from_millis(50)), Err(LineError::Timeout));
    }

    #[test]
    fn an_exit_is_reported_as_closed_and_a_missing_program_fails_to_spawn() {
        let mut p = LineProcess::spawn(&sh("exit 3"), "test-exit").unwrap();
        match p.recv(Duration::from_secs(5)) {
            Err(LineError::Closed(d)) => assert!(d.contains("stdout closed"), "{d}"),
            other => panic!("{other:?}"),
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while p.running() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(!p.running());
        assert_eq!(p.exit_status().as_deref(), Some("exit status: 3"));
        let e = LineProcess::spawn(&["/nonexistent/worker".to_string()], "t").err();
        assert!(e.is_some());
        assert!(LineProcess::spawn(&[], "t").is_err());
    }

    /// Started from a thread that has ended, a process keeps running: the parent-death
    /// signal follows the thread that forked, so processes are forked from one that lasts.
    #[test]
    fn a_process_outlives_the_thread_that_started_it() {
        let mut p = std::thread::spawn(|| LineProcess::spawn(&["cat".to_string()], "t"))
            .join()
            .unwrap()
            .unwrap();
        std::thread::sleep(Duration::from_millis(200));
        assert!(p.running());
        p.send("still here\n".into());
        assert_eq!(p.recv(Duration::from_secs(5)), Ok("still here".into()));
    }

    /// A leader that has exited is seen as exited while it stays unreaped (a zombie holding
    /// its pid, so its group's id cannot be given to another group), and its group is
    /// signalled before it is reaped: what it left running is killed, then it is gone.
    #[test]
    fn an_exited_leader_is_reaped_only_after_its_group_is_signalled() {
        let mut p = LineProcess::spawn(&sh("sleep 30 & echo $!; exit 0"), "test-leader").unwrap();
        let orphan = p.recv(Duration::from_secs(5)).unwrap();
        let leader = p.child.id();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !has_exited(&p.child) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(has_exited(&p.child), "the leader exited");
        assert_eq!(state(leader), Some('Z'), "seen as exited, not reaped");
        assert!(!p.running());
        assert_eq!(state(leader), None, "reaped once its group was signalled");
        let deadline = Instant::now() + Duration::from_secs(5);
        while !matches!(state(orphan.parse().unwrap()), None | Some('Z')) {
            assert!(Instant::now() < deadline, "what the leader left ran on");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// A process's state letter from /proc (None: no such process).
    fn state(pid: u32) -> Option<char> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        stat.rsplit(')').next()?.trim_start().chars().next()
    }

    /// Dropping a process whose group ignores stdin still ends it, and what it started: the
    /// whole group is killed.
    #[test]
    fn a_process_that_ignores_stdin_is_killed_on_drop_with_its_children() {
        let mut p = LineProcess::spawn(&sh("sleep 30 & echo $!; wait"), "test-sleep").unwrap();
        let child = p.recv(Duration::from_secs(5)).unwrap();
        let start = Instant::now();
        drop(p);
        assert!(start.elapsed() < Duration::from_secs(5));
        // Gone, or a zombie waiting for init to reap it, once the signal has landed.
        let ended = || {
            let stat = std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default();
            let state = stat
                .rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .to_string();
            (stat.is_empty() || state.starts_with('Z'), stat)
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        while !ended().0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let (ended, stat) = ended();
        assert!(ended, "the child outlived the drop: {stat}");
    }
}
