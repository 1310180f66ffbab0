//! Guest CPU time, shared fairly by tenant, then by session.
//!
//! Guests run on the exec runtime's few threads and come back to the
//! sandbox at every epoch tick ([`super::engine::TICK`]). Left to tokio,
//! every running guest gets an equal turn, so a tenant with 15 spinning
//! scripts would get 15 turns for each one of a tenant running a single
//! script, and that script would run 16 times slower than alone.
//!
//! Here a guest runs only while it holds a turn, and there are as many
//! turns as exec threads. At each tick a guest that others are waiting
//! for hands its turn on, and the next turn goes round-robin: to the next
//! tenant with a guest waiting, within it to its next session, within
//! that to its oldest guest. A tenant alone gets every turn; two busy
//! tenants get half each, however many execs each of them runs.
//!
//! A turn that has not come back for [`STALE`] no longer counts: its guest
//! is blocked in a host call or asleep, not using the CPU, so a guest that
//! sleeps cannot keep the others from running. When it comes back it
//! queues like any other.
//!
//! The one door is [`CpuShare`]; a run takes a [`Seat`] from it.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::engine::TICK;

/// A turn not handed back for this long no longer counts as running: four
/// ticks.
pub const STALE: Duration = Duration::from_millis(TICK.as_millis() as u64 * 4);

/// The turns on the CPU, and who waits for one.
#[derive(Debug, Clone)]
pub struct CpuShare {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    turns: usize,
    /// See [`STALE`]; waiting guests look for stale turns twice as often.
    stale: Duration,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Turns given out: id and when their guest last came back.
    held: HashMap<u64, Instant>,
    next_id: u64,
    /// Tenants with a guest waiting, in round-robin order.
    tenants: VecDeque<TenantQueue>,
}

#[derive(Debug)]
struct TenantQueue {
    tenant: Arc<str>,
    /// Sessions with a guest waiting, in round-robin order.
    sessions: VecDeque<SessionQueue>,
}

#[derive(Debug)]
struct SessionQueue {
    session: Arc<str>,
    waiting: VecDeque<oneshot::Sender<Turn>>,
}

/// One turn on the CPU; handing it back (dropping it) gives it to the next
/// guest in line.
#[derive(Debug)]
struct Turn {
    id: u64,
    /// `None` once disarmed: dropping it then gives nothing back.
    shared: Option<Arc<Shared>>,
}

impl Drop for Turn {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.take() {
            let mut state = shared.lock();
            state.held.remove(&self.id);
            shared.dispatch(&mut state);
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Turns whose guest came back within [`STALE`].
    fn live(&self, state: &State, now: Instant) -> usize {
        state
            .held
            .values()
            .filter(|since| now.duration_since(**since) < self.stale)
            .count()
    }

    /// Gives free turns to waiting guests, round-robin by tenant, then
    /// session, then age.
    fn dispatch(self: &Arc<Self>, state: &mut State) {
        let now = Instant::now();
        let mut live = self.live(state, now);
        while live < self.turns {
            let Some(tx) = state.next_waiter() else {
                return;
            };
            let id = state.next_id;
            state.next_id += 1;
            state.held.insert(id, now);
            let turn = Turn {
                id,
                shared: Some(self.clone()),
            };
            match tx.send(turn) {
                Ok(()) => live += 1,
                // Its guest is gone (the exec ended while it waited).
                Err(mut turn) => {
                    turn.shared = None;
                    state.held.remove(&id);
                }
            }
        }
    }
}

impl State {
    fn enqueue(&mut self, tenant: &Arc<str>, session: &Arc<str>, tx: oneshot::Sender<Turn>) {
        let t = match self.tenants.iter().position(|t| t.tenant == *tenant) {
            Some(i) => &mut self.tenants[i],
            None => {
                self.tenants.push_back(TenantQueue {
                    tenant: tenant.clone(),
                    sessions: VecDeque::new(),
                });
                self.tenants.back_mut().expect("just pushed")
            }
        };
        match t.sessions.iter().position(|s| s.session == *session) {
            Some(i) => t.sessions[i].waiting.push_back(tx),
            None => t.sessions.push_back(SessionQueue {
                session: session.clone(),
                waiting: VecDeque::from([tx]),
            }),
        }
    }

    /// The next waiter in round-robin order; its session and tenant go to
    /// the back of their lines while they still have guests waiting.
    fn next_waiter(&mut self) -> Option<oneshot::Sender<Turn>> {
        let mut tenant = self.tenants.pop_front()?;
        let mut session = tenant
            .sessions
            .pop_front()
            .expect("a queued tenant has a waiting session");
        let tx = session
            .waiting
            .pop_front()
            .expect("a queued session has a waiter");
        if !session.waiting.is_empty() {
            tenant.sessions.push_back(session);
        }
        if !tenant.sessions.is_empty() {
            self.tenants.push_back(tenant);
        }
        Some(tx)
    }

    fn anyone_waiting(&self) -> bool {
        !self.tenants.is_empty()
    }
}

impl CpuShare {
    /// `turns` guests may run at once (at least one); a turn not handed
    /// back for `stale` ([`STALE`] in the sandbox) no longer counts.
    pub fn new(turns: usize, stale: Duration) -> Self {
        CpuShare {
            shared: Arc::new(Shared {
                turns: turns.max(1),
                stale,
                state: Mutex::new(State::default()),
            }),
        }
    }

    /// A seat for one run of `tenant`'s `session`; it holds no turn yet.
    pub fn seat(&self, tenant: &str, session: &str) -> Arc<Seat> {
        Arc::new(Seat {
            shared: self.shared.clone(),
            tenant: tenant.into(),
            session: session.into(),
            turn: Mutex::new(None),
            waited: Mutex::new(Duration::ZERO),
        })
    }

    /// Guests waiting for a turn, per tenant (for tests and metrics).
    pub fn waiting(&self) -> Vec<(String, usize)> {
        self.shared
            .lock()
            .tenants
            .iter()
            .map(|t| {
                (
                    t.tenant.to_string(),
                    t.sessions.iter().map(|s| s.waiting.len()).sum(),
                )
            })
            .collect()
    }
}

/// One run's place at the CPU: it waits for a turn, and at each tick
/// hands it on to whoever is next.
#[derive(Debug)]
pub struct Seat {
    shared: Arc<Shared>,
    tenant: Arc<str>,
    session: Arc<str>,
    turn: Mutex<Option<Turn>>,
    waited: Mutex<Duration>,
}

impl Seat {
    /// Time this run spent waiting for a turn while others ran.
    pub fn waited(&self) -> Duration {
        *self.waited.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hands the turn back for good: the run is over.
    pub fn leave(&self) {
        drop(self.held().take());
    }

    fn held(&self) -> MutexGuard<'_, Option<Turn>> {
        self.turn.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for a turn (the first one of the run).
    pub async fn take_turn(self: Arc<Self>) {
        let rx = {
            let mut state = self.shared.lock();
            let (tx, rx) = oneshot::channel();
            state.enqueue(&self.tenant, &self.session, tx);
            self.shared.dispatch(&mut state);
            rx
        };
        self.wait(rx).await;
    }

    /// At a tick: goes on at once when nobody waits (after letting the
    /// exec runtime's other tasks run), otherwise hands the turn to the
    /// next guest in line and waits for another.
    pub async fn pass(self: Arc<Self>) {
        let rx = {
            let mut held = self.held();
            let mut state = self.shared.lock();
            if !state.anyone_waiting()
                && let Some(turn) = held.as_ref()
            {
                state.held.insert(turn.id, Instant::now());
                None
            } else {
                let (tx, rx) = oneshot::channel();
                state.enqueue(&self.tenant, &self.session, tx);
                if let Some(mut turn) = held.take() {
                    // Handed back here, under the lock, not by its Drop.
                    turn.shared = None;
                    state.held.remove(&turn.id);
                }
                self.shared.dispatch(&mut state);
                Some(rx)
            }
        };
        match rx {
            None => tokio::task::yield_now().await,
            Some(rx) => self.wait(rx).await,
        }
    }

    async fn wait(&self, mut rx: oneshot::Receiver<Turn>) {
        let started = Instant::now();
        let turn = loop {
            match tokio::time::timeout(self.shared.stale / 2, &mut rx).await {
                Ok(Ok(turn)) => break Some(turn),
                // Only a dropped share closes a channel unanswered.
                Ok(Err(_)) => break None,
                // A turn may have gone stale: give it to the next in line
                // (perhaps this one).
                Err(_) => {
                    let mut state = self.shared.lock();
                    self.shared.dispatch(&mut state);
                }
            }
        };
        *self.held() = turn;
        *self.waited.lock().unwrap_or_else(|p| p.into_inner()) += started.elapsed();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `ticks` ticks of a guest: take a turn, then pass at each tick,
    /// counting ticks per tenant into `ran`.
    async fn spin(seat: Arc<Seat>, ticks: usize, ran: Arc<Mutex<HashMap<String, usize>>>) {
        seat.clone().take_turn().await;
        for _ in 0..ticks {
            *ran.lock()
                .unwrap()
                .entry(seat.tenant.to_string())
                .or_default() += 1;
            tokio::time::sleep(Duration::from_micros(200)).await;
            seat.clone().pass().await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_tenant_with_one_guest_gets_as_many_ticks_as_a_tenant_with_eight() {
        let share = CpuShare::new(1, Duration::from_secs(10));
        let ran = Arc::new(Mutex::new(HashMap::new()));
        let mut tasks = Vec::new();
        for i in 0..8 {
            let seat = share.seat("noisy", &format!("s{}", i % 2));
            tasks.push(tokio::spawn(spin(seat, 1_000, ran.clone())));
        }
        // Let the noisy tenant fill the queue first.
        tokio::time::sleep(Duration::from_millis(20)).await;
        let quiet = tokio::spawn(spin(share.seat("quiet", "q"), 200, ran.clone()));
        let noisy_before = ran.lock().unwrap().get("noisy").copied().unwrap_or(0);
        quiet.await.unwrap();
        let noisy = ran.lock().unwrap()["noisy"] - noisy_before;
        // Round-robin by tenant: while the quiet tenant ran its 200 ticks,
        // the noisy one (8 guests) got about as many, not 8 times as many.
        assert!(
            (150..=260).contains(&noisy),
            "the noisy tenant ran {noisy} ticks while the quiet one ran 200"
        );
        for t in tasks {
            t.abort();
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn no_more_guests_hold_a_turn_than_there_are_turns() {
        let share = CpuShare::new(2, Duration::from_secs(10));
        let running = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let most = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for i in 0..6 {
            let seat = share.seat(&format!("t{}", i % 3), "s");
            let (running, most) = (running.clone(), most.clone());
            tasks.push(tokio::spawn(async move {
                seat.clone().take_turn().await;
                for _ in 0..100 {
                    let now = running.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                    most.fetch_max(now, std::sync::atomic::Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_micros(100)).await;
                    running.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                    seat.clone().pass().await;
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(most.load(std::sync::atomic::Ordering::SeqCst), 2);
        assert!(share.waiting().is_empty());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_guest_that_sleeps_holding_its_turn_does_not_block_the_others() {
        let share = CpuShare::new(1, STALE);
        let sleeper = share.seat("sleepy", "s");
        sleeper.clone().take_turn().await;
        // The sleeper never passes (blocked in a host call); another
        // tenant's guest still gets a turn once the held one is stale.
        let other = share.seat("busy", "b");
        let started = Instant::now();
        tokio::time::timeout(Duration::from_secs(2), other.clone().take_turn())
            .await
            .expect("a stale turn is given to the next guest");
        assert!(started.elapsed() >= STALE, "{:?}", started.elapsed());
        assert!(other.waited() >= STALE);
        drop(sleeper);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_guest_dropped_while_waiting_does_not_lose_its_turn() {
        let share = CpuShare::new(1, Duration::from_secs(10));
        let first = share.seat("a", "s");
        first.clone().take_turn().await;
        let gone = share.seat("b", "s");
        let waiting = tokio::spawn(gone.clone().take_turn());
        tokio::time::sleep(Duration::from_millis(2)).await;
        waiting.abort();
        let _ = waiting.await;
        drop(gone);
        // The aborted waiter's place is skipped: the next one is served
        // as soon as the first hands its turn back.
        let next = share.seat("c", "s");
        let next_turn = tokio::spawn(next.clone().take_turn());
        tokio::time::sleep(Duration::from_millis(2)).await;
        drop(first);
        tokio::time::timeout(Duration::from_secs(5), next_turn)
            .await
            .expect("served as soon as the turn came back, not when it went stale")
            .unwrap();
    }
}
