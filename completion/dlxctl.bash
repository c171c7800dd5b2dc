# bash completion for dlxctl(1)                                -*- shell-script -*-
# SPDX-License-Identifier: MIT
#
# Commands, options (each command's own, either side of the command), names
# from the daemon (`dlxctl -j list PREFIX`, on the socket the command line
# names; skipped when no daemon answers within a second) and files by extension
# for put and get.

# The names the daemon lists under the prefix $1, one a line.
_dlxctl_names()
{
        local -a sock=()
        [ -n "${_dlxctl_socket-}" ] && sock=(--socket "$_dlxctl_socket")
        local -a run=()
        type timeout &>/dev/null && run=(timeout 1)
        # one object a line, the name first; \" and \\ are the only escapes undone
        "${run[@]}" "${COMP_WORDS[0]}" "${sock[@]}" --json list -- "$1" 2>/dev/null |
                sed -n 's/^[[ ]*{"name":"\(\([^"\\]\|\\.\)*\)",.*/\1/p' |
                sed 's/\\\(["\\]\)/\1/g'
}

_dlxctl()
{
        local cur prev words cword
        if declare -F _init_completion &>/dev/null; then
                # --opt=value split into prev and cur; ':' stays inside a word
                _init_completion -s -n : || return
        else
                cur=${COMP_WORDS[COMP_CWORD]}
                prev=${COMP_WORDS[COMP_CWORD - 1]}
                words=("${COMP_WORDS[@]}")
                cword=$COMP_CWORD
        fi

        local commands='list ls stat put get rm watch stats peers'
        local global='--socket --json --help --version'

        # the words before the cursor: the socket, the command, the operands
        local _dlxctl_socket='' cmd='' dashdash=''
        local -a operands=()
        local i w
        for ((i = 1; i < cword; i++)); do
                w=${words[i]}
                if [ -z "$dashdash" ]; then
                        case $w in
                        --)
                                dashdash=1
                                continue
                                ;;
                        -s | --socket)
                                _dlxctl_socket=${words[i + 1]-}
                                ((i++))
                                continue
                                ;;
                        --socket=*)
                                _dlxctl_socket=${w#--socket=}
                                continue
                                ;;
                        -s?*)
                                _dlxctl_socket=${w#-s}
                                continue
                                ;;
                        --timeout | --count | --min-version)
                                ((i++))
                                continue
                                ;;
                        -*)
                                continue
                                ;;
                        esac
                fi
                if [ -z "$cmd" ]; then
                        cmd=$w
                else
                        operands+=("$w")
                fi
        done
        # a leading '~' stays the user's to expand
        _dlxctl_socket=${_dlxctl_socket/#\~/$HOME}

        if [ -z "$dashdash" ]; then
                # the value of an option: a socket is a file, numbers are the user's
                case $prev in
                -s | --socket)
                        compopt -o filenames 2>/dev/null
                        mapfile -t COMPREPLY < <(compgen -f -- "$cur")
                        return
                        ;;
                --timeout | --count | --min-version)
                        return
                        ;;
                esac
                case $cur in
                -*)
                        local opts=$global
                        case $cmd in
                        put) opts+=' --writable' ;;
                        get) opts+=' --timeout --min-version' ;;
                        watch) opts+=' --count --timeout' ;;
                        stats) opts+=' --prometheus' ;;
                        esac
                        mapfile -t COMPREPLY < <(compgen -W "$opts --" -- "$cur")
                        return
                        ;;
                esac
        fi

        if [ -z "$cmd" ]; then
                mapfile -t COMPREPLY < <(compgen -W "$commands" -- "$cur")
                return
        fi

        local n=${#operands[@]} files=''
        case $cmd:$n in
        list:0 | ls:0 | stat:0 | put:0 | get:0 | rm:0 | watch:0)
                # the daemon filters by prefix; a name may hold a space or a '$',
                # so no compgen -W (it expands), and the shell quotes what it inserts
                mapfile -t COMPREPLY < <(_dlxctl_names "$cur")
                compopt -o filenames 2>/dev/null
                # bash replaces only what follows the word's last ':'
                declare -F __ltrim_colon_completions &>/dev/null &&
                        __ltrim_colon_completions "$cur"
                ;;
        put:1 | get:1)
                files=1
                ;;
        peers:0)
                compopt -o filenames 2>/dev/null
                mapfile -t COMPREPLY < <(compgen -f -- "$cur")
                ;;
        esac
        if [ -n "$files" ]; then
                if declare -F _filedir &>/dev/null; then
                        _filedir '@(npy|safetensors|npz)'
                else
                        compopt -o filenames 2>/dev/null
                        mapfile -t COMPREPLY < <(compgen -d -- "$cur"
                                compgen -f -- "$cur" | grep -E '[.](npy|safetensors|npz)$')
                fi
        fi
} &&
        complete -F _dlxctl dlxctl
