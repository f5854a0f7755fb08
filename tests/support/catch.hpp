#pragma once
// The single include point for Catch2 (2.x on Debian 12). Moving to Catch2 v3 changes this
// file and catch_main.cpp only.
#include <catch2/catch.hpp>
