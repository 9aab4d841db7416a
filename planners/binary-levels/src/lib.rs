//! Binary delay levels: one TTL queue per bit of the delay.
//!
//! Level `L` is a topic exchange and a queue whose messages wait `2^L` units and
//! then dead-letter to level `L-1`. The routing key spells the delay in binary,
//! most significant bit first, then the destination; each level's bindings look
//! at their own bit only. A message enters at the exchange of its highest set bit
//! and leaves level 0 for the delivery exchange, which routes on the destination.
//!
//! With the hourglass preset each level is a direct exchange instead (its
//! default, `routing = "direct"`), which the broker routes about twice as
//! fast as a topic one: the message enters at its highest bit with the key `bit:N`,
//! carries its other set bits and `to:<destination>` as BCC keys (RabbitMQ
//! routes and dead-letters on them, and strips them before any consumer),
//! and a level that has no binding for any of its keys passes it to its
//! alternate exchange, the next lower level. These levels have names of
//! their own (`<prefix>.direct-level-NN`), so the topic levels of earlier
//! versions (`routing = "topic"`) keep draining beside them.
//!
//! A level waits whole units, so a delay rounds up to the unit (1 s by
//! default). With `precision` finer than the unit, direct levels get a second,
//! shorter chain of its own: sub-levels waiting `precision·2^j` for the bits
//! below the unit. A message with such bits waits there first; the lowest
//! sub-level dead-letters to an exit exchange that sends it, on its `enter:N`
//! key, straight into the level of its highest whole-unit bit (or, with none,
//! to delivery). Every queue still holds one TTL, so none holds a message
//! behind another that expires later, and the unit levels' declarations do not
//! change: existing levels keep working when precision is turned on.
//!
//! Level queues are quorum queues that dead-letter at least once unless
//! `queue_type = "classic"` is chosen. With the `hourglass` preset the delivery
//! exchange parks what it cannot route (a destination queue deleted while its
//! message waited) in `<prefix>.parked`; the interop presets declare the other
//! client's delivery exchange as it does, without an alternate exchange.

use hourglass_planner_sdk::*;
use serde::Deserialize;

const MAX_ROUTING_KEY: usize = 255;
/// Sub-levels below the unit: 1 s down to about 1 ms.
const MAX_SUB_LEVELS: u32 = 10;

#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "kebab-case")]
pub enum Preset {
    /// `hourglass.direct-level-NN`, `hourglass.direct-delivery` (topic routing:
    /// `hourglass.delay-level-NN`, `hourglass.delay-delivery`).
    #[default]
    Hourglass,
    /// NServiceBus v2: `nsb.v2.delay-level-NN`, `nsb.v2.delay-delivery`, quorum queues.
    NsbV2,
    /// Celery/kombu: `celery_delayed_N`, `celery_delayed_delivery`.
    Celery,
}

/// How a level decides whether a message waits in it.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "kebab-case")]
pub enum Routing {
    /// Topic exchanges; the routing key spells the delay in binary (what
    /// NServiceBus and Celery declare; the interop presets' only choice).
    Topic,
    /// Direct exchanges with a key per set bit (the hourglass preset's default).
    Direct,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub preset: Preset,
    pub levels: Option<u32>,
    pub unit: Option<DurationMs>,
    /// The finest step a delay is kept to: the unit divided by a power of two
    /// (direct routing only). Default: the unit, with no sub-levels.
    pub precision: Option<DurationMs>,
    pub queue_type: Option<QueueType>,
    /// Name prefix for the `hourglass` preset: `<prefix>.direct-level-NN` (or `.delay-level-NN`).
    pub prefix: Option<String>,
    pub routing: Option<Routing>,
    /// The policy `decide_redelivery` follows, when this strategy delays redeliveries.
    pub redelivery: Option<RedeliveryPolicy>,
}

#[derive(Debug)]
pub struct BinaryLevels {
    preset: Preset,
    prefix: String,
    routing: Routing,
    levels: u32,
    unit_ms: u64,
    /// Sub-levels below the unit: `unit_ms >> sub_levels` is the precision.
    sub_levels: u32,
    queue_type: QueueType,
    redelivery: Option<RedeliveryPolicy>,
    /// Where `plan` publishes, registered once: the delivery exchange for no
    /// delay, then level `L`'s exchange at `L + 1`.
    entries: Vec<Key>,
    /// Each direct level's key (`bit:N`), registered once: a plan names up to
    /// every level, and a registered name crosses into the host as an index,
    /// where a string is copied, checked and freed on every call.
    bit_keys: Vec<Key>,
    /// Sub-level `j`'s exchange, and its key `sub:j`, registered like the above.
    sub_entries: Vec<Key>,
    sub_keys: Vec<Key>,
    /// `enter:N`: the exit exchange's key into level `N`.
    enter_keys: Vec<Key>,
}

impl BinaryLevels {
    pub fn level_name(&self, level: u32) -> String {
        match (self.preset, self.routing) {
            (Preset::Hourglass, Routing::Direct) => format!("{}.direct-level-{level:02}", self.prefix),
            (Preset::Hourglass, Routing::Topic) => format!("{}.delay-level-{level:02}", self.prefix),
            (Preset::NsbV2, _) => format!("nsb.v2.delay-level-{level:02}"),
            (Preset::Celery, _) => format!("celery_delayed_{level}"),
        }
    }

    pub fn delivery_exchange(&self) -> String {
        match (self.preset, self.routing) {
            (Preset::Hourglass, Routing::Direct) => format!("{}.direct-delivery", self.prefix),
            (Preset::Hourglass, Routing::Topic) => format!("{}.delay-delivery", self.prefix),
            (Preset::NsbV2, _) => "nsb.v2.delay-delivery".into(),
            (Preset::Celery, _) => "celery_delayed_delivery".into(),
        }
    }

    /// Where the delivery exchange sends what no destination is bound for (hourglass preset only).
    pub fn parking(&self) -> Option<Parking> {
        match self.preset {
            Preset::Hourglass => Some(Parking::under(&self.prefix)),
            Preset::NsbV2 | Preset::Celery => None,
        }
    }

    /// The most precision steps a delay may take: every level and sub-level.
    fn max_steps(&self) -> u64 {
        (1u64 << (self.levels + self.sub_levels)) - 1
    }

    /// Where level `level` dead-letters and routes its zero bit to.
    fn next_exchange(&self, level: u32) -> String {
        if level == 0 { self.delivery_exchange() } else { self.level_name(level - 1) }
    }

    /// `*.` once per more significant bit, so a binding sees only its own bit.
    fn bit_prefix(&self, level: u32) -> String {
        "*.".repeat((self.levels - 1 - level) as usize)
    }

    fn routing_key(&self, units: u64, destination: &str) -> String {
        let bits = 2 * self.levels as usize;
        let mut key = vec![b'.'; bits + destination.len()];
        for (pair, level) in key[..bits].chunks_exact_mut(2).zip((0..self.levels).rev()) {
            pair[0] = b'0' + (units >> level & 1) as u8;
        }
        key[bits..].copy_from_slice(destination.as_bytes());
        String::from_utf8(key).expect("digits and dots, then the destination's text")
    }

    fn level_ttl_ms(&self, level: u32) -> u64 {
        (1u64 << level) * self.unit_ms
    }

    fn queue_arguments(&self, level: u32) -> Vec<Field> {
        self.ttl_queue_arguments(self.level_ttl_ms(level), self.next_exchange(level))
    }

    fn ttl_queue_arguments(&self, ttl_ms: u64, dead_letter_exchange: String) -> Vec<Field> {
        let mut args = self.queue_type.dead_letter_arguments();
        if self.queue_type == QueueType::Classic {
            // As NServiceBus and Celery declare classic levels (and as earlier versions did).
            args.push(text("x-overflow", "reject-publish"));
        }
        args.push(int("x-message-ttl", ttl_ms as i64));
        args.push(text("x-dead-letter-exchange", dead_letter_exchange));
        args
    }

    /// Names of the hourglass preset's levels under either routing: the
    /// other routing's levels may still be draining after a change.
    fn is_own_name(&self, name: &str) -> bool {
        let Some(rest) = name.strip_prefix(&self.prefix).and_then(|rest| rest.strip_prefix('.')) else { return false };
        self.preset == Preset::Hourglass
            && (["delay-level-", "direct-level-", "direct-hold-", "direct-sublevel-", "direct-subhold-"].iter().any(|level| rest.starts_with(level))
                || ["delay-delivery", "direct-delivery"].contains(&rest))
    }

    /// Between a direct level's exchange and its queue (see `topology`).
    fn hold_name(&self, level: u32) -> String {
        format!("{}.direct-hold-{level:02}", self.prefix)
    }

    fn precision_ms(&self) -> u64 {
        self.unit_ms >> self.sub_levels
    }

    /// Sub-level `j` waits `precision·2^j`. The precision is in the name, so
    /// changing it declares a new chain beside the old one, which drains.
    pub fn sub_level_name(&self, sub_level: u32) -> String {
        format!("{}.direct-sublevel-{}ms-{sub_level:02}", self.prefix, self.precision_ms())
    }

    fn sub_hold_name(&self, sub_level: u32) -> String {
        format!("{}.direct-subhold-{}ms-{sub_level:02}", self.prefix, self.precision_ms())
    }

    /// Where the lowest sub-level dead-letters: it sends each message on to
    /// the level of its highest whole-unit bit (`enter:N`), or to delivery.
    pub fn sub_level_exit(&self) -> String {
        format!("{}.direct-sublevel-exit", self.prefix)
    }

    /// Where sub-level `j` dead-letters and routes what is not its bit to.
    fn next_sub_exchange(&self, sub_level: u32) -> String {
        if sub_level == 0 { self.sub_level_exit() } else { self.sub_level_name(sub_level - 1) }
    }

    /// A direct level's key for one set bit.
    fn bit_key(level: u32) -> Key {
        Key::register(&format!("bit:{level}"))
    }

    /// The delivery exchange's key for a destination, with direct routing.
    fn destination_key(destination: &str) -> String {
        // Pushed, not formatted: this runs on every plan.
        let mut key = String::with_capacity(3 + destination.len());
        key.push_str("to:");
        key.push_str(destination);
        key
    }

    fn check_destination(&self, destination: &str) -> Result<(), String> {
        if destination.is_empty() {
            return Err("destination is empty".into());
        }
        if self.is_own_name(destination) {
            return Err(format!("destination {destination:?} is one of this strategy's own levels, with either routing"));
        }
        if self.routing == Routing::Direct {
            // Only `to:` comes before the destination; a direct exchange has no wildcards.
            let budget = MAX_ROUTING_KEY - Self::destination_key("").len();
            if destination.len() > budget {
                return Err(format!("destination {destination:?} is {} bytes; its routing key leaves room for {budget}", destination.len()));
            }
            return Ok(());
        }
        if destination.bytes().any(|b| b == b'*' || b == b'#') {
            return Err(format!("destination {destination:?} contains a routing wildcard (* or #)"));
        }
        let budget = MAX_ROUTING_KEY - 2 * self.levels as usize;
        if destination.len() > budget {
            return Err(format!(
                "destination {destination:?} is {} bytes; with {} levels the routing key leaves room for {budget}",
                destination.len(),
                self.levels
            ));
        }
        Ok(())
    }

    /// Direct levels: the message enters where its highest set bit waits (a
    /// sub-level's when it has bits below the unit, which wait first), with
    /// that bit's key as the routing key and the rest as `BCC` keys, highest
    /// first: the lower sub-level bits, `enter:N` for the exit, the unit
    /// bits, then the destination. No delay: the delivery exchange.
    fn direct_publish(&self, units: u64, below_unit: u64, destination: &str) -> Command {
        let unit_bits = (0..self.levels).rev().filter(|level| units >> level & 1 == 1);
        let sub_bits = (0..self.sub_levels).rev().filter(|j| below_unit >> j & 1 == 1);
        let enter = if below_unit == 0 { None } else { unit_bits.clone().next().map(|level| Name::from(self.enter_keys[level as usize])) };
        let exchange = match sub_bits.clone().next() {
            Some(highest) => self.sub_entries[highest as usize],
            None => self.entries[(u64::BITS - units.leading_zeros()) as usize],
        };
        let mut keys = sub_bits
            .map(|j| Name::from(self.sub_keys[j as usize]))
            .chain(enter)
            .chain(unit_bits.map(|level| Name::from(self.bit_keys[level as usize])))
            .chain([Name::Text(Self::destination_key(destination))]);
        let first = keys.next().expect("the destination's key at least");
        publish_bcc(exchange, first, keys.collect(), vec![])
    }

    fn direct_level(&self, level: DirectLevel, hold_arguments: &[Field]) -> [Command; 5] {
        let DirectLevel { name, hold, key, next, ttl_ms } = level;
        // The level's key goes to its hold exchange, and only from there to
        // the queue: with the queue gone, the hold exchange routes nothing and
        // parks the message, where the level exchange's alternate would have
        // passed it down a level, early.
        [
            declare_exchange(&hold, ExchangeKind::Fanout, hold_arguments.to_vec()),
            declare_exchange(&name, ExchangeKind::Direct, vec![text("alternate-exchange", &next)]),
            declare_queue(&name, self.ttl_queue_arguments(ttl_ms, next)),
            bind_queue(&name, &hold, ""),
            bind_exchange(&name, &hold, key),
        ]
    }
}

/// One direct level or sub-level: its exchange and queue (`name`), its hold
/// exchange, the key that makes a message wait in it, and the exchange it
/// passes everything else to and dead-letters to (`next`).
struct DirectLevel<'a> {
    name: String,
    hold: String,
    key: &'a str,
    next: String,
    ttl_ms: u64,
}

impl Planner for BinaryLevels {
    type Config = Config;

    fn info() -> Info {
        Info::new("binary-levels", env!("CARGO_PKG_VERSION"), BrokerFamily::Amqp)
            .key("preset", "naming: hourglass, nsb-v2 or celery", Some("hourglass"))
            .key("levels", "number of delay levels (bits)", Some("28"))
            .key("unit", "delay of level 0; delays round up to it (1ms for sub-second)", Some("1s"))
            .key(
                "precision",
                "the finest step, the unit divided by a power of two (e.g. 125ms): sub-levels below the unit keep delays to it without redeclaring the levels (direct routing)",
                Some("the unit"),
            )
            .key("queue_type", "quorum (dead-letters at least once) or classic (a broker crash can lose messages)", Some("quorum"))
            .key("prefix", "name prefix of the hourglass preset", Some("hourglass"))
            .key(
                "routing",
                "direct (the hourglass preset's default; about twice as fast) or topic (the interop presets' only choice, and hourglass's levels before 0.2)",
                Some("direct"),
            )
    }

    fn new(config: Config) -> Result<Self, String> {
        let interop = matches!(config.preset, Preset::NsbV2 | Preset::Celery);
        let levels = config.levels.unwrap_or(28);
        let unit_ms = config.unit.map_or(1_000, DurationMs::ms);
        if interop && (levels != 28 || unit_ms != 1_000) {
            return Err(format!("preset {:?} shares infrastructure with other clients: it needs levels = 28 and unit = \"1s\"", config.preset));
        }
        let queue_type = match (config.preset, config.queue_type) {
            (Preset::NsbV2, Some(QueueType::Classic)) => {
                return Err("preset nsb-v2 uses quorum queues; queue_type = \"classic\" cannot interoperate".into());
            }
            (Preset::NsbV2, _) => QueueType::Quorum,
            (_, chosen) => chosen.unwrap_or_default(),
        };
        let prefix = match (config.preset, config.prefix) {
            (Preset::Hourglass, prefix) => prefix.unwrap_or_else(|| "hourglass".to_string()),
            (_, Some(_)) => return Err("prefix: only the hourglass preset takes a prefix; the others use fixed names".into()),
            (_, None) => String::new(),
        };
        let routing = match (interop, config.routing) {
            (true, Some(Routing::Direct)) => {
                return Err(format!(
                    "routing: preset {:?} shares topic levels with other clients; routing = \"direct\" is for the hourglass preset",
                    config.preset
                ));
            }
            (true, _) => Routing::Topic,
            (false, chosen) => chosen.unwrap_or(Routing::Direct),
        };
        if prefix.is_empty() && config.preset == Preset::Hourglass || prefix.len() > 200 {
            return Err(format!("prefix: {prefix:?} must be 1 to 200 bytes"));
        }
        if !(1..=32).contains(&levels) {
            return Err(format!("levels: {levels} is out of range 1..=32"));
        }
        if unit_ms == 0 {
            return Err("unit: must be at least 1ms".into());
        }
        let top_ttl = (1u64 << (levels - 1)).checked_mul(unit_ms);
        if top_ttl.is_none_or(|ttl| ttl > AMQP_MAX_TTL_MS) {
            return Err(format!("levels = {levels} with unit = {unit_ms}ms gives the top level a TTL above the broker's 10-year maximum"));
        }
        let sub_levels = match config.precision.map(DurationMs::ms) {
            None => 0,
            Some(precision) if precision == unit_ms => 0,
            Some(_) if routing != Routing::Direct => {
                return Err("precision: sub-levels need routing = \"direct\" (the hourglass preset's default)".into());
            }
            Some(precision) => sub_levels_for(unit_ms, precision)?,
        };
        let precision_ms = unit_ms >> sub_levels;
        let max_delay_ms = unit_ms.saturating_mul((1u64 << levels) - 1) + (unit_ms - precision_ms);
        let redelivery = checked_policy(config.redelivery, max_delay_ms)?;
        // Only direct routing publishes with these keys.
        let direct = routing == Routing::Direct;
        let bit_keys = (0..if direct { levels } else { 0 }).map(Self::bit_key).collect();
        let mut planner = BinaryLevels {
            preset: config.preset,
            prefix,
            routing,
            levels,
            unit_ms,
            sub_levels,
            queue_type,
            redelivery,
            entries: Vec::new(),
            bit_keys,
            sub_entries: Vec::new(),
            sub_keys: (0..sub_levels).map(|j| Key::register(&format!("sub:{j}"))).collect(),
            // Only the exit routes on them: none without sub-levels.
            enter_keys: (0..if sub_levels > 0 { levels } else { 0 }).map(|level| Key::register(&format!("enter:{level}"))).collect(),
        };
        planner.entries =
            std::iter::once(planner.delivery_exchange()).chain((0..levels).map(|level| planner.level_name(level))).map(|name| Key::register(&name)).collect();
        planner.sub_entries = (0..sub_levels).map(|j| Key::register(&planner.sub_level_name(j))).collect();
        Ok(planner)
    }

    fn delay_range(&self) -> DelayRange {
        DelayRange::uniform(self.precision_ms(), self.max_steps() * self.precision_ms())
    }

    fn topology(&self) -> Result<Vec<Command>, String> {
        let mut commands = Vec::new();
        let mut delivery_arguments = Vec::new();
        if let Some(parking) = self.parking() {
            commands.extend(parking.topology(self.queue_type));
            delivery_arguments.push(parking.alternate_exchange());
        }
        if self.routing == Routing::Direct {
            // Lowest first, so each level's alternate exchange exists before it.
            commands.push(declare_exchange(&self.delivery_exchange(), ExchangeKind::Direct, delivery_arguments.clone()));
            for level in 0..self.levels {
                let level = DirectLevel {
                    name: self.level_name(level),
                    hold: self.hold_name(level),
                    key: self.bit_keys[level as usize].as_str(),
                    next: self.next_exchange(level),
                    ttl_ms: self.level_ttl_ms(level),
                };
                commands.extend(self.direct_level(level, &delivery_arguments));
            }
            if self.sub_levels > 0 {
                // The exit needs the levels (its bindings) and delivery (its alternate) first.
                let exit = self.sub_level_exit();
                commands.push(declare_exchange(&exit, ExchangeKind::Direct, vec![text("alternate-exchange", self.delivery_exchange())]));
                for level in 0..self.levels {
                    commands.push(bind_exchange(&exit, &self.level_name(level), self.enter_keys[level as usize].as_str()));
                }
                for sub_level in 0..self.sub_levels {
                    let sub_level = DirectLevel {
                        name: self.sub_level_name(sub_level),
                        hold: self.sub_hold_name(sub_level),
                        key: self.sub_keys[sub_level as usize].as_str(),
                        next: self.next_sub_exchange(sub_level),
                        ttl_ms: self.precision_ms() << sub_level,
                    };
                    commands.extend(self.direct_level(sub_level, &delivery_arguments));
                }
            }
            return Ok(commands);
        }
        // Every exchange first: exchange-to-exchange bindings fail unless both exist.
        commands.push(declare_exchange(&self.delivery_exchange(), ExchangeKind::Topic, delivery_arguments));
        for level in (0..self.levels).rev() {
            commands.push(declare_exchange(&self.level_name(level), ExchangeKind::Topic, vec![]));
        }
        for level in (0..self.levels).rev() {
            let name = self.level_name(level);
            let prefix = self.bit_prefix(level);
            commands.push(declare_queue(&name, self.queue_arguments(level)));
            commands.push(bind_queue(&name, &name, &format!("{prefix}1.#")));
            commands.push(bind_exchange(&name, &self.next_exchange(level), &format!("{prefix}0.#")));
        }
        Ok(commands)
    }

    fn destination_setup(&self, destination: &str) -> Result<Vec<Command>, String> {
        self.check_destination(destination)?;
        // Interop presets bind as NServiceBus and Celery do; ours counts the words
        // exactly so `a.b` never also receives what was meant for `b`.
        let key = match (self.preset, self.routing) {
            (Preset::Hourglass, Routing::Direct) => Self::destination_key(destination),
            (Preset::Hourglass, Routing::Topic) => format!("{}{destination}", "*.".repeat(self.levels as usize)),
            (Preset::NsbV2 | Preset::Celery, _) => format!("#.{destination}"),
        };
        Ok(vec![bind_queue(destination, &self.delivery_exchange(), &key)])
    }

    fn decide_redelivery(&self, request: &RedeliveryRequest) -> Result<RedeliveryDecision, String> {
        decide_with(self.redelivery.as_ref(), request)
    }

    fn plan(&self, request: &PlanRequest) -> Result<Plan, String> {
        self.check_destination(&request.destination)?;
        let precision_ms = self.precision_ms();
        let steps = units_rounded_up(request.delay_ms, precision_ms);
        if steps > self.max_steps() {
            return Err(format!(
                "delay {}ms is above the maximum {}ms of {} levels x {}ms",
                request.delay_ms,
                self.max_steps() * precision_ms,
                self.levels,
                self.unit_ms
            ));
        }
        let (units, below_unit) = (steps >> self.sub_levels, steps & ((1 << self.sub_levels) - 1));
        let publish = match self.routing {
            // No delay: the delivery exchange; else the level of the highest set bit.
            Routing::Topic => publish(self.entries[(u64::BITS - units.leading_zeros()) as usize], self.routing_key(units, &request.destination), vec![]),
            Routing::Direct => self.direct_publish(units, below_unit, &request.destination),
        };
        Ok(Plan { commands: vec![publish], delivers_after_ms: steps * precision_ms })
    }
}

/// How many halvings of `unit_ms` make `precision_ms`, if it is one of them.
fn sub_levels_for(unit_ms: u64, precision_ms: u64) -> Result<u32, String> {
    let ratio = unit_ms / precision_ms.max(1);
    if precision_ms == 0 || precision_ms > unit_ms || ratio * precision_ms != unit_ms || !ratio.is_power_of_two() {
        return Err(format!("precision: {precision_ms}ms must be the unit ({unit_ms}ms) divided by a power of two, at least 1ms"));
    }
    let sub_levels = ratio.trailing_zeros();
    if sub_levels > MAX_SUB_LEVELS {
        return Err(format!("precision: {precision_ms}ms needs {sub_levels} sub-levels below the unit; at most {MAX_SUB_LEVELS}"));
    }
    Ok(sub_levels)
}

register_planner!(BinaryLevels);

#[cfg(test)]
mod tests {
    use super::*;

    fn config(preset: Preset, routing: Routing) -> Config {
        Config { preset, routing: Some(routing), ..Config::default() }
    }

    fn planner(preset: Preset) -> BinaryLevels {
        BinaryLevels::new(config(preset, Routing::Topic)).unwrap()
    }

    fn direct() -> BinaryLevels {
        BinaryLevels::new(config(Preset::Hourglass, Routing::Direct)).unwrap()
    }

    #[test]
    fn direct_routing_enters_at_the_highest_bit_and_carries_the_others_and_the_destination_as_bcc() {
        let p = direct();
        let plan = p.plan(&request(10_000)).unwrap();
        let Command::Publish(publish) = &plan.commands[0] else { panic!("expected publish") };
        assert_eq!(publish.exchange, "hourglass.direct-level-03");
        assert_eq!(publish.routing_key, "bit:3");
        assert_eq!(publish.bcc, vec!["bit:1".to_string(), "to:destination".to_string()]);
        let Command::Publish(now) = &p.plan(&request(0)).unwrap().commands[0] else { panic!() };
        assert_eq!((now.exchange.as_str(), now.routing_key.as_str(), now.bcc.len()), ("hourglass.direct-delivery", "to:destination", 0));
        let Command::Publish(one) = &p.plan(&request(1_000)).unwrap().commands[0] else { panic!() };
        assert_eq!(one.routing_key, "bit:0");
        assert_eq!(one.bcc, vec!["to:destination"]);
        assert_eq!(p.destination_setup("orders").unwrap(), vec![bind_queue("orders", "hourglass.direct-delivery", "to:orders")]);
    }

    #[test]
    fn each_direct_level_passes_what_is_not_its_bit_to_the_next_lower_and_the_lowest_to_delivery() {
        let topology = direct().topology().unwrap();
        for level in 0..28u32 {
            let name = format!("hourglass.direct-level-{level:02}");
            let next = if level == 0 { "hourglass.direct-delivery".to_string() } else { format!("hourglass.direct-level-{:02}", level - 1) };
            let exchange = topology
                .iter()
                .position(|c| matches!(c, Command::DeclareExchange(e) if e.name == name && e.kind == ExchangeKind::Direct && e.arguments == vec![text("alternate-exchange", &next)]))
                .unwrap_or_else(|| panic!("{name} is a direct exchange whose alternate is {next}"));
            let alternate = topology.iter().position(|c| matches!(c, Command::DeclareExchange(e) if e.name == next)).unwrap();
            assert!(alternate < exchange, "{next} is declared before {name}");
            // The bit reaches the queue through the level's hold exchange, which parks what it cannot route.
            let hold = format!("hourglass.direct-hold-{level:02}");
            assert!(topology.contains(&bind_exchange(&name, &hold, &format!("bit:{level}"))));
            assert!(topology.contains(&bind_queue(&name, &hold, "")));
            assert!(topology.contains(&declare_exchange(&hold, ExchangeKind::Fanout, vec![text("alternate-exchange", "hourglass.parking")])));
            let queue = topology.iter().find_map(|c| match c {
                Command::DeclareQueue(q) if q.name == name => Some(q),
                _ => None,
            });
            assert!(queue.unwrap().arguments.contains(&text("x-dead-letter-exchange", &next)));
        }
        assert!(topology.contains(&declare_exchange("hourglass.direct-delivery", ExchangeKind::Direct, vec![text("alternate-exchange", "hourglass.parking")])));
    }

    #[test]
    fn the_levels_of_either_routing_are_never_destinations() {
        for p in [direct(), planner(Preset::Hourglass)] {
            for name in
                ["hourglass.delay-level-05", "hourglass.direct-level-00", "hourglass.direct-hold-03", "hourglass.delay-delivery", "hourglass.direct-delivery"]
            {
                let err = p.destination_setup(name).unwrap_err();
                assert!(err.contains("own levels"), "{name}: {err}");
            }
            assert!(p.destination_setup("hourglass.orders").is_ok());
        }
    }

    #[test]
    fn direct_routing_is_for_the_hourglass_preset_only() {
        let err = BinaryLevels::new(config(Preset::NsbV2, Routing::Direct)).unwrap_err();
        assert!(err.contains("routing"), "{err}");
    }

    fn request(delay_ms: u64) -> PlanRequest {
        PlanRequest { destination: "destination".into(), delay_ms, message_id: "m".into(), routing_key: None }
    }

    #[test]
    fn ten_seconds_enters_at_level_three_with_the_binary_key() {
        let plan = planner(Preset::Hourglass).plan(&request(10_000)).unwrap();
        let Command::Publish(p) = &plan.commands[0] else { panic!("expected publish") };
        assert_eq!(p.exchange, "hourglass.delay-level-03");
        assert_eq!(p.routing_key, format!("{}1.0.1.0.destination", "0.".repeat(24)));
        assert_eq!(plan.delivers_after_ms, 10_000);
    }

    #[test]
    fn each_highest_bit_enters_at_its_own_level_with_the_key_spelling_the_units() {
        for preset in [Preset::Hourglass, Preset::NsbV2, Preset::Celery] {
            let p = planner(preset);
            for level in 0..28 {
                for units in [1u64 << level, (2u64 << level) - 1] {
                    let plan = p.plan(&request(units * 1_000)).unwrap();
                    let Command::Publish(publish) = &plan.commands[0] else { panic!("expected publish") };
                    assert_eq!(publish.exchange, p.level_name(level), "{units} units");
                    let bits: String = (0..28).rev().map(|bit| if units >> bit & 1 == 1 { "1." } else { "0." }).collect();
                    assert_eq!(publish.routing_key, format!("{bits}destination"));
                }
            }
        }
    }

    #[test]
    fn delays_round_up_to_the_unit_and_zero_goes_straight_to_delivery() {
        let p = planner(Preset::Hourglass);
        assert_eq!(p.plan(&request(1_001)).unwrap().delivers_after_ms, 2_000);
        let Command::Publish(zero) = &p.plan(&request(0)).unwrap().commands[0] else { panic!() };
        assert_eq!(zero.exchange, "hourglass.delay-delivery");
    }

    #[test]
    fn above_the_maximum_is_an_error_naming_it() {
        let err = planner(Preset::Hourglass).plan(&request((1 << 28) * 1_000)).unwrap_err();
        assert!(err.contains("above the maximum 268435455000ms"), "{err}");
    }

    #[test]
    fn nsb_preset_matches_the_published_topology() {
        let p = planner(Preset::NsbV2);
        let topology = p.topology().unwrap();
        let queue = topology
            .iter()
            .find_map(|c| match c {
                Command::DeclareQueue(q) if q.name == "nsb.v2.delay-level-01" => Some(q),
                _ => None,
            })
            .unwrap();
        assert!(queue.arguments.contains(&text("x-queue-type", "quorum")));
        assert!(queue.arguments.contains(&text("x-dead-letter-strategy", "at-least-once")));
        assert!(queue.arguments.contains(&int("x-message-ttl", 2_000)));
        assert!(queue.arguments.contains(&text("x-dead-letter-exchange", "nsb.v2.delay-level-00")));
        assert!(topology.contains(&bind_queue("nsb.v2.delay-level-01", "nsb.v2.delay-level-01", &format!("{}1.#", "*.".repeat(26)))));
        assert!(topology.contains(&bind_exchange("nsb.v2.delay-level-00", "nsb.v2.delay-delivery", &format!("{}0.#", "*.".repeat(27)))));
        assert_eq!(p.destination_setup("orders").unwrap(), vec![bind_queue("orders", "nsb.v2.delay-delivery", "#.orders")]);
    }

    #[test]
    fn interop_presets_refuse_settings_that_would_not_interoperate() {
        let err = BinaryLevels::new(Config { preset: Preset::Celery, levels: Some(20), routing: Some(Routing::Topic), ..Config::default() }).unwrap_err();
        assert!(err.contains("levels = 28"), "{err}");
        assert!(
            BinaryLevels::new(Config { preset: Preset::NsbV2, queue_type: Some(QueueType::Classic), routing: Some(Routing::Topic), ..Config::default() })
                .is_err()
        );
    }

    fn level_queues(p: &BinaryLevels) -> Vec<DeclareQueue> {
        p.topology()
            .unwrap()
            .into_iter()
            .filter_map(|c| match c {
                Command::DeclareQueue(q) if q.name.contains("delay-level") => Some(q),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn level_queues_are_quorum_and_dead_letter_at_least_once_by_default() {
        let queues = level_queues(&planner(Preset::Hourglass));
        assert_eq!(queues.len(), 28);
        for q in queues {
            assert!(q.arguments.contains(&text("x-queue-type", "quorum")), "{}", q.name);
            assert!(q.arguments.contains(&text("x-dead-letter-strategy", "at-least-once")), "{}", q.name);
            assert!(q.arguments.contains(&text("x-overflow", "reject-publish")), "{}", q.name);
        }
    }

    #[test]
    fn classic_is_an_explicit_choice_without_at_least_once() {
        let p = BinaryLevels::new(Config {
            preset: Preset::Hourglass,
            levels: Some(3),
            queue_type: Some(QueueType::Classic),
            routing: Some(Routing::Topic),
            ..Config::default()
        })
        .unwrap();
        for q in level_queues(&p) {
            assert!(q.arguments.contains(&text("x-queue-type", "classic")), "{}", q.name);
            assert!(!q.arguments.iter().any(|f| f.key == "x-dead-letter-strategy"), "{}", q.name);
        }
    }

    #[test]
    fn the_delivery_exchange_parks_what_it_cannot_route() {
        let topology = planner(Preset::Hourglass).topology().unwrap();
        let delivery = topology.iter().position(|c| matches!(c, Command::DeclareExchange(e) if e.name == "hourglass.delay-delivery")).unwrap();
        let Command::DeclareExchange(exchange) = &topology[delivery] else { unreachable!() };
        assert_eq!(exchange.arguments, vec![text("alternate-exchange", "hourglass.parking")]);
        let parking = topology.iter().position(|c| matches!(c, Command::DeclareExchange(e) if e.name == "hourglass.parking")).unwrap();
        assert!(parking < delivery, "the parking exchange comes first");
        assert!(topology.contains(&bind_queue("hourglass.parked", "hourglass.parking", "")));
        // The interop presets' delivery exchange is the other client's: declared as it declares it.
        for preset in [Preset::NsbV2, Preset::Celery] {
            let topology = planner(preset).topology().unwrap();
            assert!(topology.iter().all(|c| !matches!(c, Command::DeclareExchange(e) if !e.arguments.is_empty())));
        }
    }

    #[test]
    fn long_destinations_are_refused_before_the_routing_key_overflows() {
        let long = "d".repeat(200);
        let err = planner(Preset::Hourglass).destination_setup(&long).unwrap_err();
        assert!(err.contains("leaves room for 199"), "{err}");
    }

    fn precise(precision_ms: u64) -> BinaryLevels {
        BinaryLevels::new(Config { precision: Some(DurationMs(precision_ms)), ..Config::default() }).unwrap()
    }

    fn keys(plan: &Plan) -> (String, String, Vec<String>) {
        let Command::Publish(publish) = &plan.commands[0] else { panic!("expected publish") };
        (publish.exchange.to_string(), publish.routing_key.to_string(), publish.bcc.iter().map(Name::to_string).collect())
    }

    #[test]
    fn precision_is_the_unit_halved_and_only_with_direct_routing() {
        assert_eq!(precise(125).sub_levels, 3);
        assert_eq!(precise(1_000).sub_levels, 0, "the unit itself: no sub-levels");
        for (precision, expected) in [(300, "divided by a power of two"), (0, "divided by a power of two"), (2_000, "divided by a power of two")] {
            let err = BinaryLevels::new(Config { precision: Some(DurationMs(precision)), ..Config::default() }).unwrap_err();
            assert!(err.starts_with("precision:") && err.contains(expected), "{precision}: {err}");
        }
        let err =
            BinaryLevels::new(Config { levels: Some(20), unit: Some(DurationMs(4_096)), precision: Some(DurationMs(2)), ..Config::default() }).unwrap_err();
        assert!(err.contains("11 sub-levels"), "{err}");
        let topic = Config { precision: Some(DurationMs(125)), routing: Some(Routing::Topic), ..Config::default() };
        assert!(BinaryLevels::new(topic).unwrap_err().contains("routing = \"direct\""));
        assert_eq!(precise(125).delay_range(), DelayRange::uniform(125, ((1 << 28) - 1) * 1_000 + 875));
    }

    #[test]
    fn with_precision_the_bits_below_the_unit_wait_first_and_the_exit_enters_the_highest_unit_bit() {
        let p = precise(125);
        // 1,300 ms is 11 steps of 125 ms: one unit (bit 0) and 0b011 below it.
        let plan = p.plan(&request(1_300)).unwrap();
        assert_eq!(plan.delivers_after_ms, 1_375);
        assert_eq!(
            keys(&plan),
            ("hourglass.direct-sublevel-125ms-01".into(), "sub:1".into(), vec!["sub:0".into(), "enter:0".into(), "bit:0".into(), "to:destination".into()])
        );
        // Under a unit: no level to enter, so the exit passes it to delivery (its alternate).
        let plan = p.plan(&request(300)).unwrap();
        assert_eq!(plan.delivers_after_ms, 375);
        assert_eq!(keys(&plan), ("hourglass.direct-sublevel-125ms-01".into(), "sub:1".into(), vec!["sub:0".into(), "to:destination".into()]));
        // Whole units take the levels alone, as without precision.
        assert_eq!(keys(&p.plan(&request(10_000)).unwrap()), keys(&direct().plan(&request(10_000)).unwrap()));
        let plan = p.plan(&request(10_001)).unwrap();
        assert_eq!(plan.delivers_after_ms, 10_125);
        assert_eq!(keys(&plan).2, vec!["enter:3".to_string(), "bit:3".into(), "bit:1".into(), "to:destination".into()]);
        assert_eq!(keys(&plan).0, "hourglass.direct-sublevel-125ms-00");
        let top = p.plan(&request(((1 << 28) - 1) * 1_000 + 875)).unwrap();
        assert_eq!(keys(&top).0, "hourglass.direct-sublevel-125ms-02");
        assert!(p.plan(&request(((1 << 28) - 1) * 1_000 + 876)).unwrap_err().contains("above the maximum"));
    }

    #[test]
    fn sub_levels_chain_down_to_an_exit_that_enters_each_level_on_its_key_and_leaves_the_levels_as_they_were() {
        let p = precise(125);
        let topology = p.topology().unwrap();
        let position = |name: &str| topology.iter().position(|c| matches!(c, Command::DeclareExchange(e) if e.name == name)).unwrap();
        let exit = "hourglass.direct-sublevel-exit";
        assert!(topology.contains(&declare_exchange(exit, ExchangeKind::Direct, vec![text("alternate-exchange", "hourglass.direct-delivery")])));
        for level in 0..28 {
            let name = format!("hourglass.direct-level-{level:02}");
            assert!(topology.contains(&bind_exchange(exit, &name, &format!("enter:{level}"))));
            assert!(position(&name) < position(exit));
        }
        for (j, ttl) in [(0u32, 125i64), (1, 250), (2, 500)] {
            let (name, hold) = (format!("hourglass.direct-sublevel-125ms-{j:02}"), format!("hourglass.direct-subhold-125ms-{j:02}"));
            let next = if j == 0 { exit.to_string() } else { format!("hourglass.direct-sublevel-125ms-{:02}", j - 1) };
            assert!(topology.contains(&declare_exchange(&name, ExchangeKind::Direct, vec![text("alternate-exchange", &next)])));
            assert!(position(&next) < position(&name), "{next} before {name}");
            assert!(topology.contains(&bind_exchange(&name, &hold, &format!("sub:{j}"))));
            assert!(topology.contains(&bind_queue(&name, &hold, "")));
            assert!(topology.contains(&declare_exchange(&hold, ExchangeKind::Fanout, vec![text("alternate-exchange", "hourglass.parking")])));
            let queue = topology
                .iter()
                .find_map(|c| match c {
                    Command::DeclareQueue(q) if q.name == name => Some(q),
                    _ => None,
                })
                .unwrap();
            assert!(queue.arguments.contains(&int("x-message-ttl", ttl)) && queue.arguments.contains(&text("x-dead-letter-exchange", &next)));
            assert!(queue.arguments.contains(&text("x-queue-type", "quorum")));
        }
        // Turning precision on declares the unit levels exactly as before.
        let without = direct().topology().unwrap();
        assert!(without.iter().all(|c| topology.contains(c)), "every earlier declaration is unchanged");
        for name in ["hourglass.direct-sublevel-125ms-00", "hourglass.direct-subhold-125ms-02", exit] {
            assert!(p.destination_setup(name).unwrap_err().contains("own levels"), "{name}");
        }
    }
}
