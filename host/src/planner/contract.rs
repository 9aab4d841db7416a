//! The contract versions a planner may be built against, behind one face:
//! [`ContractPre`] picks the version a component implements, and each call
//! on a [`Contract`] answers in the current version's types.

use wasmtime::component::{ComponentType, InstancePre, Linker, Lower, TypedFunc};
use wasmtime::{Store, StoreLimits};

use super::bindings::hourglass::planner::{diagnostics, types as wit};
use super::bindings::v0_1::hourglass::planner::{diagnostics as diagnostics_v0_1, types as wit_v0_1};
use super::bindings::v0_2::hourglass::planner::{diagnostics as diagnostics_v0_2, types as wit_v0_2};
use super::bindings::v0_3::hourglass::planner::{diagnostics as diagnostics_v0_3, types as wit_v0_3};
use super::bindings::v0_4::hourglass::planner::{diagnostics as diagnostics_v0_4, types as wit_v0_4};
use super::bindings::{PlannerWorld, PlannerWorldPre, v0_1, v0_2, v0_3, v0_4};
use super::upgrade;

/// The contract's `plan-request`, borrowing the host's strings: lowering
/// copies them straight into the planner's memory, without the owned copy of
/// each that the generated `wit::PlanRequest` would need first. It is the
/// same record in every version.
#[derive(ComponentType, Lower)]
#[component(record)]
pub(crate) struct PlanRequestRef<'a> {
    pub destination: &'a str,
    #[component(name = "delay-ms")]
    pub delay_ms: u64,
    #[component(name = "message-id")]
    pub message_id: &'a str,
    #[component(name = "routing-key")]
    pub routing_key: Option<&'a str>,
}

/// What a planner's store holds besides its memory (the contract's host
/// functions write into it).
pub(crate) struct StoreState {
    pub(super) limits: StoreLimits,
    pub(super) panic_message: Option<String>,
}

/// `plan` typed with the borrowing request, in a version's result types.
/// The `String` is the contract's `result<_, string>`: the planner's own
/// refusal, passed on as it wrote it, not an error of the host's.
type PlanFunc<'a, P> = TypedFunc<(PlanRequestRef<'a>,), (Result<P, String>,)>;

// The shared types interfaces have no functions; bindgen still asks for their traits.
impl wit::Host for StoreState {}
impl wit_v0_4::Host for StoreState {}
impl wit_v0_3::Host for StoreState {}
impl wit_v0_2::Host for StoreState {}
impl wit_v0_1::Host for StoreState {}

impl diagnostics::Host for StoreState {
    fn report_panic(&mut self, message: String) {
        self.panic_message = Some(message);
    }
}

impl diagnostics_v0_4::Host for StoreState {
    fn report_panic(&mut self, message: String) {
        self.panic_message = Some(message);
    }
}

impl diagnostics_v0_3::Host for StoreState {
    fn report_panic(&mut self, message: String) {
        self.panic_message = Some(message);
    }
}

impl diagnostics_v0_2::Host for StoreState {
    fn report_panic(&mut self, message: String) {
        self.panic_message = Some(message);
    }
}

impl diagnostics_v0_1::Host for StoreState {
    fn report_panic(&mut self, message: String) {
        self.panic_message = Some(message);
    }
}

/// What the host gives a planner of any version (only diagnostics).
pub(crate) fn add_to_linker(linker: &mut Linker<StoreState>) -> wasmtime::Result<()> {
    use wasmtime::component::HasSelf;
    PlannerWorld::add_to_linker::<StoreState, HasSelf<StoreState>>(linker, |state| state)?;
    v0_4::PlannerWorld::add_to_linker::<StoreState, HasSelf<StoreState>>(linker, |state| state)?;
    v0_3::PlannerWorld::add_to_linker::<StoreState, HasSelf<StoreState>>(linker, |state| state)?;
    v0_2::PlannerWorld::add_to_linker::<StoreState, HasSelf<StoreState>>(linker, |state| state)?;
    v0_1::PlannerWorld::add_to_linker::<StoreState, HasSelf<StoreState>>(linker, |state| state)
}

/// Why a component is no planner of any contract version the host knows.
#[derive(Debug, thiserror::Error)]
pub enum ContractMismatch {
    #[error("as 0.5.0: {current:#}; as 0.4.0: {v0_4:#}; as 0.3.0: {v0_3:#}; as 0.2.0: {v0_2:#}; as 0.1.0: {v0_1:#}")]
    NoVersion { current: wasmtime::Error, v0_4: wasmtime::Error, v0_3: wasmtime::Error, v0_2: wasmtime::Error, v0_1: wasmtime::Error },
    #[error("its plan does not have the contract's types: {0:#}")]
    PlanTypes(wasmtime::Error),
    /// Its imports cannot be linked (WASI beyond what a runtime needs to start, say).
    #[error("{0:#}")]
    Imports(wasmtime::Error),
}

/// A pre-linked planner and the contract version it implements.
pub(crate) enum ContractPre {
    Current(PlannerWorldPre<StoreState>),
    V0_4(v0_4::PlannerWorldPre<StoreState>),
    V0_3(v0_3::PlannerWorldPre<StoreState>),
    V0_2(v0_2::PlannerWorldPre<StoreState>),
    V0_1(v0_1::PlannerWorldPre<StoreState>),
}

impl ContractPre {
    /// The newest version the component implements; the error says why none fits.
    pub fn new(pre: InstancePre<StoreState>) -> Result<ContractPre, ContractMismatch> {
        let current = match PlannerWorldPre::new(pre.clone()) {
            Ok(current) => return Ok(ContractPre::Current(current)),
            Err(err) => err,
        };
        let v0_4 = match v0_4::PlannerWorldPre::new(pre.clone()) {
            Ok(v0_4) => return Ok(ContractPre::V0_4(v0_4)),
            Err(err) => err,
        };
        let v0_3 = match v0_3::PlannerWorldPre::new(pre.clone()) {
            Ok(v0_3) => return Ok(ContractPre::V0_3(v0_3)),
            Err(err) => err,
        };
        let v0_2 = match v0_2::PlannerWorldPre::new(pre.clone()) {
            Ok(v0_2) => return Ok(ContractPre::V0_2(v0_2)),
            Err(err) => err,
        };
        v0_1::PlannerWorldPre::new(pre).map(ContractPre::V0_1).map_err(|v0_1| ContractMismatch::NoVersion { current, v0_4, v0_3, v0_2, v0_1 })
    }

    /// An instance; its `plan` is type-checked once here against [`PlanRequestRef`].
    pub fn instantiate(&self, store: &mut Store<StoreState>) -> wasmtime::Result<Result<Contract, ContractMismatch>> {
        let world = match self {
            ContractPre::Current(pre) => World::Current(pre.instantiate(&mut *store)?),
            ContractPre::V0_4(pre) => World::V0_4(pre.instantiate(&mut *store)?),
            ContractPre::V0_3(pre) => World::V0_3(pre.instantiate(&mut *store)?),
            ContractPre::V0_2(pre) => World::V0_2(pre.instantiate(&mut *store)?),
            ContractPre::V0_1(pre) => World::V0_1(pre.instantiate(&mut *store)?),
        };
        let checked = match &world {
            World::Current(world) => world.hourglass_planner_planner().func_plan().func().typed(&*store).map(|_: PlanFunc<'static, wit::DelayPlan>| ()),
            World::V0_4(world) => world.hourglass_planner_planner().func_plan().func().typed(&*store).map(|_: PlanFunc<'static, wit_v0_4::DelayPlan>| ()),
            World::V0_3(world) => world.hourglass_planner_planner().func_plan().func().typed(&*store).map(|_: PlanFunc<'static, wit_v0_3::DelayPlan>| ()),
            World::V0_2(world) => world.hourglass_planner_planner().func_plan().func().typed(&*store).map(|_: PlanFunc<'static, wit_v0_2::DelayPlan>| ()),
            World::V0_1(world) => world.hourglass_planner_planner().func_plan().func().typed(&*store).map(|_: PlanFunc<'static, wit_v0_1::DelayPlan>| ()),
        };
        Ok(checked.map(|()| Contract { world }).map_err(ContractMismatch::PlanTypes))
    }
}

/// An instantiated planner; every answer comes in the current version's
/// types. Made only by [`ContractPre::instantiate`], which checks the types
/// `plan` is called with.
pub(crate) struct Contract {
    world: World,
}

enum World {
    Current(PlannerWorld),
    V0_4(v0_4::PlannerWorld),
    V0_3(v0_3::PlannerWorld),
    V0_2(v0_2::PlannerWorld),
    V0_1(v0_1::PlannerWorld),
}

/// A call's outcome: a trap, or the contract's `result<T, string>` (the
/// planner's refusal in its own words).
type Answer<T> = wasmtime::Result<Result<T, String>>;

impl Contract {
    pub fn describe(&self, store: &mut Store<StoreState>) -> wasmtime::Result<wit::PlannerInfo> {
        match &self.world {
            World::Current(w) => w.hourglass_planner_planner().call_describe(store),
            World::V0_4(w) => w.hourglass_planner_planner().call_describe(store).map(upgrade::v0_4::info),
            World::V0_3(w) => w.hourglass_planner_planner().call_describe(store).map(upgrade::v0_3::info),
            World::V0_2(w) => w.hourglass_planner_planner().call_describe(store).map(upgrade::v0_2::info),
            World::V0_1(w) => w.hourglass_planner_planner().call_describe(store).map(upgrade::v0_1::info),
        }
    }

    pub fn configure(&self, store: &mut Store<StoreState>, config_json: &str) -> Answer<wit::DelayRange> {
        match &self.world {
            World::Current(w) => w.hourglass_planner_planner().call_configure(store, config_json),
            World::V0_4(w) => Ok(w.hourglass_planner_planner().call_configure(store, config_json)?.map(upgrade::v0_4::delay_range)),
            World::V0_3(w) => Ok(w.hourglass_planner_planner().call_configure(store, config_json)?.map(upgrade::v0_3::delay_range)),
            World::V0_2(w) => Ok(w.hourglass_planner_planner().call_configure(store, config_json)?.map(upgrade::v0_2::delay_range)),
            World::V0_1(w) => Ok(w.hourglass_planner_planner().call_configure(store, config_json)?.map(upgrade::v0_1::delay_range)),
        }
    }

    /// The strings `name.registered` indexes: none before 0.3.0.
    pub fn names(&self, store: &mut Store<StoreState>) -> wasmtime::Result<Vec<String>> {
        match &self.world {
            World::Current(w) => w.hourglass_planner_planner().call_names(store),
            World::V0_4(w) => w.hourglass_planner_planner().call_names(store),
            World::V0_3(w) => w.hourglass_planner_planner().call_names(store),
            World::V0_2(_) | World::V0_1(_) => Ok(Vec::new()),
        }
    }

    pub fn topology(&self, store: &mut Store<StoreState>) -> Answer<Vec<wit::Command>> {
        match &self.world {
            World::Current(w) => w.hourglass_planner_planner().call_topology(store),
            World::V0_4(w) => Ok(w.hourglass_planner_planner().call_topology(store)?.map(upgrade::v0_4::commands)),
            World::V0_3(w) => Ok(w.hourglass_planner_planner().call_topology(store)?.map(upgrade::v0_3::commands)),
            World::V0_2(w) => Ok(w.hourglass_planner_planner().call_topology(store)?.map(upgrade::v0_2::commands)),
            World::V0_1(w) => Ok(w.hourglass_planner_planner().call_topology(store)?.map(upgrade::v0_1::commands)),
        }
    }

    pub fn destination_setup(&self, store: &mut Store<StoreState>, destination: &str) -> Answer<Vec<wit::Command>> {
        match &self.world {
            World::Current(w) => w.hourglass_planner_planner().call_destination_setup(store, destination),
            World::V0_4(w) => Ok(w.hourglass_planner_planner().call_destination_setup(store, destination)?.map(upgrade::v0_4::commands)),
            World::V0_3(w) => Ok(w.hourglass_planner_planner().call_destination_setup(store, destination)?.map(upgrade::v0_3::commands)),
            World::V0_2(w) => Ok(w.hourglass_planner_planner().call_destination_setup(store, destination)?.map(upgrade::v0_2::commands)),
            World::V0_1(w) => Ok(w.hourglass_planner_planner().call_destination_setup(store, destination)?.map(upgrade::v0_1::commands)),
        }
    }

    pub fn plan(&self, store: &mut Store<StoreState>, request: PlanRequestRef<'_>) -> Answer<wit::DelayPlan> {
        // SAFETY (every arm): `ContractPre::instantiate` type-checked this
        // instance's `plan` against these parameter and result types (the
        // lifetime aside, which the check does not depend on).
        match &self.world {
            World::Current(w) => {
                let plan = unsafe { PlanFunc::<wit::DelayPlan>::new_unchecked(*w.hourglass_planner_planner().func_plan().func()) };
                plan.call(store, (request,)).map(|(result,)| result)
            }
            World::V0_4(w) => {
                let plan = unsafe { PlanFunc::<wit_v0_4::DelayPlan>::new_unchecked(*w.hourglass_planner_planner().func_plan().func()) };
                plan.call(store, (request,)).map(|(result,)| result.map(upgrade::v0_4::delay_plan))
            }
            World::V0_3(w) => {
                let plan = unsafe { PlanFunc::<wit_v0_3::DelayPlan>::new_unchecked(*w.hourglass_planner_planner().func_plan().func()) };
                plan.call(store, (request,)).map(|(result,)| result.map(upgrade::v0_3::delay_plan))
            }
            World::V0_2(w) => {
                let plan = unsafe { PlanFunc::<wit_v0_2::DelayPlan>::new_unchecked(*w.hourglass_planner_planner().func_plan().func()) };
                plan.call(store, (request,)).map(|(result,)| result.map(upgrade::v0_2::delay_plan))
            }
            World::V0_1(w) => {
                let plan = unsafe { PlanFunc::<wit_v0_1::DelayPlan>::new_unchecked(*w.hourglass_planner_planner().func_plan().func()) };
                plan.call(store, (request,)).map(|(result,)| result.map(upgrade::v0_1::delay_plan))
            }
        }
    }

    pub fn handle_due(&self, store: &mut Store<StoreState>, message: &wit::DueMessage) -> Answer<wit::DueAction> {
        match &self.world {
            World::Current(w) => w.hourglass_planner_planner().call_handle_due(store, message),
            World::V0_4(w) => Ok(w.hourglass_planner_planner().call_handle_due(store, &upgrade::v0_4::due_message(message))?.map(upgrade::v0_4::due_action)),
            World::V0_3(w) => Ok(w.hourglass_planner_planner().call_handle_due(store, &upgrade::v0_3::due_message(message))?.map(upgrade::v0_3::due_action)),
            World::V0_2(w) => Ok(w.hourglass_planner_planner().call_handle_due(store, &upgrade::v0_2::due_message(message))?.map(upgrade::v0_2::due_action)),
            World::V0_1(w) => Ok(w.hourglass_planner_planner().call_handle_due(store, &upgrade::v0_1::due_message(message))?.map(upgrade::v0_1::due_action)),
        }
    }

    /// A held stream's message: only planners of 0.4.0 and later can hold on NATS.
    pub fn handle_held(&self, store: &mut Store<StoreState>, message: &wit::HeldMessage) -> Answer<wit::HeldAction> {
        match &self.world {
            World::Current(w) => w.hourglass_planner_planner().call_handle_held(store, message),
            World::V0_4(w) => Ok(w.hourglass_planner_planner().call_handle_held(store, &upgrade::v0_4::held_message(message))?.map(upgrade::v0_4::held_action)),
            World::V0_3(_) | World::V0_2(_) | World::V0_1(_) => Ok(Err("built against a contract before 0.4.0, it has no handle-held".to_string())),
        }
    }

    pub fn decide_redelivery(&self, store: &mut Store<StoreState>, request: &wit::RedeliveryRequest) -> Answer<wit::RedeliveryDecision> {
        match &self.world {
            World::Current(w) => w.hourglass_planner_planner().call_decide_redelivery(store, request),
            World::V0_4(w) => Ok(w
                .hourglass_planner_planner()
                .call_decide_redelivery(store, &upgrade::v0_4::redelivery_request(request))?
                .map(upgrade::v0_4::redelivery_decision)),
            World::V0_3(w) => Ok(w
                .hourglass_planner_planner()
                .call_decide_redelivery(store, &upgrade::v0_3::redelivery_request(request))?
                .map(upgrade::v0_3::redelivery_decision)),
            World::V0_2(w) => Ok(w
                .hourglass_planner_planner()
                .call_decide_redelivery(store, &upgrade::v0_2::redelivery_request(request))?
                .map(upgrade::v0_2::redelivery_decision)),
            World::V0_1(w) => Ok(w
                .hourglass_planner_planner()
                .call_decide_redelivery(store, &upgrade::v0_1::redelivery_request(request))?
                .map(upgrade::v0_1::redelivery_decision)),
        }
    }
}
