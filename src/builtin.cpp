// Built-in transport registration and the constructors that need it. Kept out of the core
// library so the core does not depend on any transport (each transport is its own target).
#include <ringfence/communicator.hpp>
#include <ringfence/env.hpp>
#include <ringfence/log.hpp>
#include <ringfence/transports/shm.hpp>
#include <ringfence/transports/tcp.hpp>

namespace ringfence {

TransportRegistry builtin_transports() {
  TransportRegistry registry;
  // Priority order: shared memory within a host, tcp across hosts (and wherever shm cannot).
  registry.add(std::string(transports::shm::kName), &transports::shm::make_transport, transports::shm::setting_keys());
  registry.add(std::string(transports::tcp::kName), &transports::tcp::make_transport, transports::tcp::setting_keys());
  return registry;
}

Communicator Communicator::from_env() {
  const Environment env = Environment::from_process();
  CommOptions options = CommOptions::from_env(env);
  const LaunchInfo launch = detect_launch(env);
  const Logger log = make_logger(options.log_level, launch.rank, options.log_file, options.log_timestamps);
  // The transports' own variables (RINGFENCE_SHM_*, RINGFENCE_TCP_*, ...) are known too: they
  // are read when the transports are made, so only names no one reads are called typos.
  TransportRegistry transports = builtin_transports();
  warn_unknown_variables(log, env, transports.setting_variables());
  if (launch.token_is_derived)
    log.info("job token derived from the {} job id (not secret); set RINGFENCE_JOB_TOKEN to authenticate", to_string(launch.launcher));
  return from_launch(launch, std::move(transports), std::move(options));
}

Communicator::Communicator(const UniqueId& id, int rank, int size, CommOptions options)
    : Communicator(from_launch(
          [&] {
            LaunchInfo launch;
            launch.rank = rank;
            launch.size = size;
            launch.store_host = id.host();
            launch.store_port = id.port();
            launch.token = id.token();
            launch.host_store = rank == 0;
            return launch;
          }(),
          builtin_transports(), std::move(options))) {}

}  // namespace ringfence
