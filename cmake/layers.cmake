# The layer table of docs/architecture.md, enforced by the build: each layer's library compiles
# against a view of the source tree (symbolic links under ${CMAKE_BINARY_DIR}/layers/<folder>/)
# holding only that folder, the folders its row allows, and the public headers, so an include that
# points up the table fails to compile. tools/check-layers reads the same table.

set(CHORUS_LAYER_TABLE ${PROJECT_SOURCE_DIR}/docs/architecture.md)
set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${CHORUS_LAYER_TABLE})
# The rows (| `folder/` | what | may include |), semicolons in their text made commas first: they
# would split the list.
file(READ ${CHORUS_LAYER_TABLE} chorus_layer_text)
string(REPLACE ";" "," chorus_layer_text "${chorus_layer_text}")
string(REGEX MATCHALL "\n\\| `[a-z/]+/` \\|[^\n]*" chorus_layer_rows "${chorus_layer_text}")
if(NOT chorus_layer_rows)
  message(FATAL_ERROR "${CHORUS_LAYER_TABLE} has no layer table (rows beginning | `folder/` |)")
endif()

# chorus_layer_view(<target> <folder> [PRIVATE]): compiles <target> against <folder>'s view. PUBLIC
# unless PRIVATE is given, so what links the target sees the same view (a subset of the view of any
# layer above).
function(chorus_layer_view target folder)
  set(scope PUBLIC)
  if(ARGN)
    set(scope ${ARGN})
  endif()
  set(allowed "")
  set(found OFF)
  foreach(row IN LISTS chorus_layer_rows)
    if(row MATCHES "^\n\\| `${folder}` \\|.*\\|([^|]*)\\|$")
      string(REGEX MATCHALL "`[a-z/]+/`" allowed "${CMAKE_MATCH_1}")
      string(REPLACE "`" "" allowed "${allowed}")
      set(found ON)
    endif()
  endforeach()
  if(NOT found)
    message(FATAL_ERROR "${folder} has no row in ${CHORUS_LAYER_TABLE}")
  endif()
  string(REGEX REPLACE "/$" "" name "${folder}")
  string(REPLACE "/" "_" name "${name}")
  set(view ${CMAKE_BINARY_DIR}/layers/${name})
  file(MAKE_DIRECTORY ${view}/src)
  # Links are replaced, never followed: file(REMOVE) on a link removes the link alone.
  file(GLOB stale LIST_DIRECTORIES true ${view}/src/* ${view}/kernels ${view}/chorus)
  foreach(link IN LISTS stale)
    if(IS_SYMLINK ${link})
      file(REMOVE ${link})
    endif()
  endforeach()
  file(CREATE_LINK ${PROJECT_SOURCE_DIR}/include/chorus ${view}/chorus SYMBOLIC)
  foreach(dir ${folder} ${allowed})
    string(REGEX REPLACE "/$" "" dir "${dir}")
    file(CREATE_LINK ${PROJECT_SOURCE_DIR}/${dir} ${view}/${dir} SYMBOLIC)
  endforeach()
  target_include_directories(${target} ${scope} $<BUILD_INTERFACE:${view}>)
endfunction()
