//! Guest CPU time, shared fairly by tenant, then by session.
//!
//! Guests run on the exec runtime's few threads and come back to the
//! sandbox at every epoch tick ([`super::engine::TICK`]). Left to tokio,
//! every running guest gets an equal turn, so a tenant with 15 spinning
//! scripts would get 15 turns for each one of a tenant running a single
//! script, and that script would run 16 times slower than alone.
//!
//! Here a guest runs only while it holds a turn, and there are as many
//! turns as exec threads. Turns are shared max-min fairly between the
//! tenants that want them: a free turn goes to the waiting tenant that
//! holds the fewest, and at each tick a guest hands its turn on when a
//! waiting tenant holds fewer turns than its own tenant does, or else to
//! the next waiting guest of its own tenant (round-robin by session, then
//! oldest first). A tenant alone gets every turn; with two turns and two
//! busy tenants each keeps one, however many execs each of them runs; with
//! more tenants than turns they take turns at each tick.
//!
//! A turn that has not come back for [`STALE`] no longer counts: its guest
//! is blocked in a host call or asleep, not using the CPU, so a guest that
//! sleeps cannot keep the others from running. When it comes back it
//! goes on, and hands its turn on at its next tick if that is fair.
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
    /// Turns given out.
    held: HashMap<u64, Held>,
    next_id: u64,
    /// Tenants with a guest waiting; ties between tenants holding as many
    /// turns go to the one nearest the front.
    tenants: VecDeque<TenantQueue>,
}

#[derive(Debug)]
struct Held {
    tenant: Arc<str>,
    /// When its guest last came back.
    since: Instant,
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

    fn is_live(&self, held: &Held, now: Instant) -> bool {
        now.duration_since(held.since) < self.stale
    }

    /// Live turns per tenant, and in all.
    fn live(&self, state: &State, now: Instant) -> (HashMap<Arc<str>, usize>, usize) {
        let mut by_tenant: HashMap<Arc<str>, usize> = HashMap::new();
        let mut all = 0;
        for h in state.held.values().filter(|h| self.is_live(h, now)) {
            *by_tenant.entry(h.tenant.clone()).or_default() += 1;
            all += 1;
        }
        (by_tenant, all)
    }

    /// Gives free turns to waiting guests, each to the waiting tenant that
    /// holds the fewest.
    fn dispatch(self: &Arc<Self>, state: &mut State) {
        let now = Instant::now();
        let (mut by_tenant, mut live) = self.live(state, now);
        while live < self.turns {
            let Some((index, _)) = state.neediest(&by_tenant, None) else {
                return;
            };
            let tenant = state.tenants[index].tenant.clone();
            if self.give(state, index, now) {
                *by_tenant.entry(tenant).or_default() += 1;
                live += 1;
            }
        }
    }

    /// Gives a new turn to the next waiter of the tenant at `index`; false
    /// when that waiter was gone (its exec ended while it waited).
    fn give(self: &Arc<Self>, state: &mut State, index: usize, now: Instant) -> bool {
        let (tenant, tx) = state.pop_from(index);
        let id = state.next_id;
        state.next_id += 1;
        state.held.insert(id, Held { tenant, since: now });
        let turn = Turn {
            id,
            shared: Some(self.clone()),
        };
        match tx.send(turn) {
            Ok(()) => true,
            Err(mut turn) => {
                // Handed back here, under the lock, not by its Drop.
                turn.shared = None;
                state.held.remove(&id);
                false
            }
        }
    }
}

impl State {
    fn enqueue(&mut self, tenant: &Arc<str>, session: &Arc<str>, tx: oneshot::Sender<Turn>) {
        let t = match self.position(tenant) {
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

    fn position(&self, tenant: &str) -> Option<usize> {
        self.tenants.iter().position(|t| &*t.tenant == tenant)
    }

    /// The waiting tenant (other than `except`) that holds the fewest live
    /// turns, nearest the front on ties: its index and its count.
    fn neediest(
        &self,
        by_tenant: &HashMap<Arc<str>, usize>,
        except: Option<&str>,
    ) -> Option<(usize, usize)> {
        self.tenants
            .iter()
            .enumerate()
            .filter(|(_, t)| except != Some(&*t.tenant))
            .map(|(i, t)| (i, by_tenant.get(&t.tenant).copied().unwrap_or(0)))
            .min_by_key(|&(i, held)| (held, i))
    }

    /// Pops the next waiter of the tenant at `index`: its next session's
    /// oldest guest. The session goes to the back of its tenant's line and
    /// the tenant to the back of the line while they still have guests
    /// waiting.
    fn pop_from(&mut self, index: usize) -> (Arc<str>, oneshot::Sender<Turn>) {
        let mut tenant = self.tenants.remove(index).expect("a queued tenant");
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
        let name = tenant.tenant.clone();
        if !tenant.sessions.is_empty() {
            self.tenants.push_back(tenant);
        }
        (name, tx)
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

    /// Guests waiting for a turn, per tenant.
    #[cfg(test)]
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

/// What a guest does with its turn at a tick.
enum Next {
    /// Go on holding it.
    Keep,
    /// Queue again; the turn goes to the next waiter of the tenant at this
    /// index, or with `None` to no one in particular.
    Queue(Option<usize>),
}

/// One run's place at the CPU: it waits for a turn, and at each tick
/// hands it on when that is fair.
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

    /// At a tick: hands the turn to a waiting tenant that holds fewer turns
    /// than this one's, or else to this tenant's next waiting guest, and
    /// waits for another; when neither waits, goes on (after letting the
    /// exec runtime's other tasks run).
    pub async fn pass(self: Arc<Self>) {
        let rx = {
            let mut held = self.held();
            let mut state = self.shared.lock();
            let now = Instant::now();
            let next = match held.as_ref() {
                Some(turn) => self.next(&state, turn, now),
                // No turn (the share was dropped): queue for one.
                None => Next::Queue(None),
            };
            match (held.take(), next) {
                (Some(turn), Next::Keep) => {
                    if let Some(h) = state.held.get_mut(&turn.id) {
                        h.since = now;
                    }
                    *held = Some(turn);
                    None
                }
                (turn, next) => {
                    let (tx, rx) = oneshot::channel();
                    state.enqueue(&self.tenant, &self.session, tx);
                    if let Some(mut turn) = turn {
                        // Handed back here, under the lock, not by its Drop.
                        turn.shared = None;
                        state.held.remove(&turn.id);
                    }
                    if let Next::Queue(Some(index)) = next {
                        self.shared.give(&mut state, index, now);
                    }
                    self.shared.dispatch(&mut state);
                    Some(rx)
                }
            }
        };
        match rx {
            None => YieldOnce(false).await,
            Some(rx) => self.wait(rx).await,
        }
    }

    /// What to do with `turn` at a tick.
    fn next(&self, state: &State, turn: &Turn, now: Instant) -> Next {
        let (by_tenant, live) = self.shared.live(state, now);
        // A turn that went stale was lent out again; coming back, it counts
        // once more.
        let stale_own = usize::from(
            state
                .held
                .get(&turn.id)
                .is_some_and(|h| !self.shared.is_live(h, now)),
        );
        if live + stale_own > self.shared.turns {
            // More guests run than there are turns (one came back from a
            // long host call): this one queues again, and no turn is given
            // in its place.
            return Next::Queue(None);
        }
        let mine = by_tenant.get(&self.tenant).copied().unwrap_or(0) + stale_own;
        let fewer = state
            .neediest(&by_tenant, Some(&self.tenant))
            .filter(|&(_, held)| held < mine)
            .map(|(i, _)| i);
        match fewer.or_else(|| state.position(&self.tenant)) {
            Some(index) => Next::Queue(Some(index)),
            None => Next::Keep,
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

/// Lets the exec runtime's other tasks run once, then goes on. Unlike
/// `tokio::task::yield_now`, whose wake tokio defers until the worker has
/// nothing else to do (as much as 61 polls later, each of which may be
/// another guest's 5 ms tick), a task that wakes itself goes to the back of
/// its worker's run queue at once.
struct YieldOnce(bool);

impl std::future::Future for YieldOnce {
    type Output = ();

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        if self.0 {
            return std::task::Poll::Ready(());
        }
        self.0 = true;
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
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

    /// Eight guests of the tenant "noisy", spread over `sessions` sessions,
    /// each spinning `ticks` ticks; returned once they have had 20 ms to
    /// fill the queue.
    async fn noisy_neighbours(
        share: &CpuShare,
        sessions: usize,
        ticks: usize,
        ran: &Arc<Mutex<HashMap<String, usize>>>,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        let tasks = (0..8)
            .map(|i| {
                let seat = share.seat("noisy", &format!("s{}", i % sessions));
                tokio::spawn(spin(seat, ticks, ran.clone()))
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(20)).await;
        tasks
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_tenant_with_one_guest_gets_as_many_ticks_as_a_tenant_with_eight() {
        let share = CpuShare::new(1, Duration::from_secs(10));
        let ran = Arc::new(Mutex::new(HashMap::new()));
        let tasks = noisy_neighbours(&share, 2, 1_000, &ran).await;
        let quiet = tokio::spawn(spin(share.seat("quiet", "q"), 200, ran.clone()));
        let noisy_before = ran.lock().unwrap().get("noisy").copied().unwrap_or(0);
        quiet.await.unwrap();
        let noisy = ran.lock().unwrap()["noisy"] - noisy_before;
        // Shared by tenant: while the quiet tenant ran its 200 ticks,
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
    async fn with_two_turns_a_lone_guest_keeps_one_while_eight_neighbours_share_the_other() {
        let share = CpuShare::new(2, Duration::from_secs(10));
        let ran = Arc::new(Mutex::new(HashMap::new()));
        let tasks = noisy_neighbours(&share, 8, 100_000, &ran).await;
        let seat = share.seat("quiet", "q");
        let started = Instant::now();
        spin(seat.clone(), 100, ran.clone()).await;
        // It waited for its first turn (one noisy tick at most), then kept
        // it: the noisy tenant already held its one turn of two.
        assert!(
            seat.waited() < started.elapsed() / 4,
            "waited {:?} of {:?}",
            seat.waited(),
            started.elapsed()
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
        let stale = Duration::from_millis(200);
        let share = CpuShare::new(1, stale);
        let sleeper = share.seat("sleepy", "s");
        sleeper.clone().take_turn().await;
        // The sleeper never passes (blocked in a host call); another
        // tenant's guest still gets a turn once the held one is stale.
        let other = share.seat("busy", "b");
        let started = Instant::now();
        tokio::time::timeout(Duration::from_secs(2), other.clone().take_turn())
            .await
            .expect("a stale turn is given to the next guest");
        assert!(started.elapsed() >= stale, "{:?}", started.elapsed());
        assert!(other.waited() >= stale);
        // The sleeper comes back: two guests now hold the one turn, so at
        // its tick it queues instead of going on, until the other is done.
        let back = tokio::spawn(sleeper.clone().pass());
        tokio::time::sleep(stale / 4).await;
        assert!(!back.is_finished(), "the returning guest queued");
        other.leave();
        tokio::time::timeout(Duration::from_secs(2), back)
            .await
            .expect("served once the other handed its turn back")
            .unwrap();
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
