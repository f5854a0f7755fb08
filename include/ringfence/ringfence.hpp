#pragma once
/// \file ringfence.hpp
/// Umbrella header: everything a user of ringfence needs.

#include <ringfence/communicator.hpp>
#include <ringfence/env.hpp>
#include <ringfence/error.hpp>
#include <ringfence/log.hpp>
#include <ringfence/options.hpp>
#include <ringfence/reduce_ops.hpp>
#include <ringfence/registry.hpp>
#include <ringfence/status.hpp>
#include <ringfence/store.hpp>
#include <ringfence/transport.hpp>
#include <ringfence/tuner.hpp>
#include <ringfence/types.hpp>
#include <ringfence/version.hpp>
